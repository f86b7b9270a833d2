"""The one mechanism every stage runs on: bucket plans and flat parameters, the sharded bucket's
life cycle and its guard, the gather schedule, the gradient reducers and the masters the optimizer steps."""
