"""Horizon predictors for BR-H: none, oracle (built in) and the deployable kinds survival, exact, learned.

The deployable kinds are registered here, in this order, so that `base.predict`
switches over them with the bank built by `bank.build_bank`.
"""

from jaxroute.predictors.base import (
    PredictorKind,
    RequestFeatures,
    expected_contribution,
    kind_id,
    kind_names,
    predict,
    register,
)
from jaxroute.predictors.exact import predict_exact
from jaxroute.predictors.learned import predict_learned
from jaxroute.predictors.survival import predict_survival

register(PredictorKind("survival", predict_survival))
register(PredictorKind("exact", predict_exact))
register(PredictorKind("learned", predict_learned))

__all__ = ["PredictorKind", "RequestFeatures", "expected_contribution", "kind_id", "kind_names", "predict", "register"]
