"""Horizon predictors for BR-H: none, oracle (built in) and deployable kinds registered by their modules."""

from jaxroute.predictors.base import (
    PredictorKind,
    RequestFeatures,
    expected_contribution,
    kind_id,
    kind_names,
    predict,
    register,
)

__all__ = ["PredictorKind", "RequestFeatures", "expected_contribution", "kind_id", "kind_names", "predict", "register"]
