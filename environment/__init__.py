"""Market data: loading and validating price files, features and splits, and the environments.

Importing it registers the single-portfolio env with gymnasium: ``gymnasium.make("erl_trader/Portfolio-v0",
data=PATH, split="train", settings={...})`` (``environment.gym_env.make_portfolio_env``)."""

import gymnasium

if "erl_trader/Portfolio-v0" not in gymnasium.registry:
    gymnasium.register(id="erl_trader/Portfolio-v0", entry_point="environment.gym_env:make_portfolio_env")
