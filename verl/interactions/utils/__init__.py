"""Loading interactions from their YAML (:mod:`verl.interactions.utils.interaction_registry`)."""
