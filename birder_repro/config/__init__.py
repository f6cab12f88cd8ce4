"""The run's settings: the config's own keys and checks, where the configs live, a config as plain data, the config
tree composed outside the app (the reference configs)."""
