"""The mass-weighted Hessian S at a point: its symmetry orbits, its spectrum's ends (Lanczos), the frozen Jacobian of
the flow."""
