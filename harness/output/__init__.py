"""What a run writes: the request, step and summary tables, and the plots drawn from them."""
