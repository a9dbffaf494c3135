"""predictors."""
