"""The flow near a certified minimum: the theory's rates (2 lambda_min, lambda_min) measured by simulation."""
