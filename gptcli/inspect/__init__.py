"""Looking inside a model: attention maps (attention.py) and the logit lens (lens.py), both
through model.Probe."""
