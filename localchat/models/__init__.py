"""Model files: SPEC resolution, the hub, file checks, facts and the memory planner."""
