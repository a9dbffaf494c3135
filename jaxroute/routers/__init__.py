"""routers."""
