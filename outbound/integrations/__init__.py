"""One module per downstream Plumb calls; each raises only `jobs.errors` exceptions."""
