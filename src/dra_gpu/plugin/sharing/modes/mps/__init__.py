"""MPS sharing: protocol 2 (`daemon`: one daemon per GPU, limits in each client's environment) and
protocol 3 (`namespaces`: one namespace per claim, limits kept by the server); `common` holds what both use."""
