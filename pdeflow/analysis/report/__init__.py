"""``pdeflow report``: the pipeline of stages, one section per statement of the model contract, the page."""
