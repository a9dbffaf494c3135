"""inference-perf configs read as they are (`jaxroute.workloads.inference_perf`): the mapping and the refusals."""

import numpy as np
import pytest
import yaml

from jaxroute.errors import JaxrouteError
from jaxroute.workloads import inference_perf as ip

STAGES = {"type": "constant", "stages": [{"rate": 2, "duration": 10}, {"rate": 6.5, "duration": 4}]}


def test_shared_prefix_config_maps_to_the_shared_prefix_workload_and_its_stages():
    cfg = {"load": dict(STAGES, num_workers=2, worker_max_concurrency=5), "api": {"type": "completion"},
           "server": {"type": "vllm"},
           "data": {"type": "shared_prefix", "shared_prefix": {"num_unique_system_prompts": 3,
                                                                "num_users_per_system_prompt": 4,
                                                                "system_prompt_len": 200, "question_len": 40,
                                                                "output_len": 30}}}
    load = ip.load(cfg)
    assert load.stages == ((2.0, 10.0), (6.5, 4.0)) and load.stage_requests == (20, 26) and load.requests == 46
    assert load.concurrency_cap == 10 and load.load_type == "constant"
    assert load.flags() == {"workload": "shared-prefix", "rate_stages": [(2.0, 10.0), (6.5, 4.0)], "requests": 46,
                            "sp_groups": 3, "sp_prompts_per_group": 4, "sp_system_len": 200, "sp_question_len": 40,
                            "sp_output_len": 30}
    assert any("drain" in n for n in load.notes)
    wl = ip.workload(load)
    assert wl.n_requests == 46 and wl.rate_stages == ((2.0, 10.0), (6.5, 4.0))
    # the legacy names of inference-perf's fields are read too (config/datagen/config.py AliasChoices)
    legacy = ip.load({"load": STAGES, "data": {"type": "shared_prefix", "shared_prefix": {"num_groups": 3,
                                                                                      "num_prompts_per_group": 4}}})
    assert legacy.shared_prefix["groups"] == 3 and legacy.shared_prefix["prompts_per_group"] == 4


def test_length_distributions_are_sampled_in_inference_perfs_order():
    dist = {"type": "normal", "min": 10, "max": 100, "mean": 50, "std_dev": 20}
    cfg = {"load": STAGES, "data": {"type": "shared_prefix", "shared_prefix": {
        "num_groups": 2, "num_prompts_per_group": 3, "system_prompt_len": 100, "question_len": dist,
        "output_len": {"type": "uniform", "min": 5, "max": 9}, "seed": 7}}}
    sp = ip.load(cfg).shared_prefix
    # shared_prefix_datagen.py lines 100-114: system lengths, then per group its questions and its outputs
    rng = np.random.default_rng(7)
    q, o = [], []
    for _ in range(2):
        q.append(np.clip(np.round(np.clip(rng.normal(50, 20, 3), 10, 100)), 10, 100))
        o.append(np.clip(np.round(np.clip(rng.uniform(5, 10, 3), 5, 9)), 5, 9))
    assert np.array_equal(sp["question_tokens"], np.concatenate(q)) and np.array_equal(sp["output_tokens"], np.concatenate(o))
    assert np.array_equal(sp["system_tokens"], [100, 100])
    assert ip.load(cfg).flags()["sp_question_len"] is None  # not one number: no flag form
    wl = ip.workload(ip.load(cfg))
    assert sorted({int(t) for s in wl.request_shapes for t in [s[1]]}) == sorted(set(np.concatenate(o).tolist()))


def test_random_data_gives_private_prompts_with_generated_lengths():
    cfg = {"load": {"stages": [{"rate": 1, "duration": 5}]},
           "data": {"type": "random", "input_distribution": {"min": 20, "max": 80, "mean": 50, "std_dev": 10,
                                                             "total_count": 8},
                    "output_distribution": {"type": "fixed", "mean": 12, "total_count": 8}}}
    load = ip.load(cfg, seed=3)
    assert load.shared_prefix is None and len(load.prompt_tokens) == 8 and set(load.output_tokens) == {12}
    assert load.prompt_tokens.min() >= 20 and load.prompt_tokens.max() <= 80
    wl = ip.workload(load)
    assert wl.n_shared == 0 and wl.n_requests == 5  # nothing shared: every prompt private


@pytest.mark.parametrize("config, message", [
    ({"load": STAGES, "data": {"type": "shareGPT"}}, "data.type 'shareGPT' is not modelled"),
    ({"load": {"type": "concurrent", "stages": [{"num_requests": 5, "concurrency_level": 2}]},
      "data": {"type": "shared_prefix"}}, "load.stages.0.rate"),
    ({"load": {"type": "trace_replay", "stages": [{"rate": 1, "duration": 2}]}, "data": {"type": "shared_prefix"}},
     "load.type 'trace_replay' is not modelled"),
    ({"load": {"stages": [], "sweep": {"type": "linear"}}, "data": {"type": "shared_prefix"}}, "load.sweep"),
    ({"load": {"stages": []}, "data": {"type": "shared_prefix"}}, "load.stages is empty"),
    ({"load": {"stages": [{"rate": 0, "duration": 5}]}, "data": {"type": "shared_prefix"}},
     "load.stages.0.rate: Input should be greater than 0"),
    ({"load": {"stages": [{"rate": 0.1, "duration": 5}]}, "data": {"type": "shared_prefix"}}, "sends int(rate x duration) = 0"),
    ({"load": STAGES, "data": {"type": "shared_prefix", "shared_prefix": {"question_len": -3}}},
     "question_len must be >= 1 token, got -3"),
    ({"load": STAGES, "data": {"type": "shared_prefix", "shared_prefix": {"num_groups": "many"}}},
     "data.shared_prefix.num_groups: Input should be a valid integer"),
    ({"load": STAGES, "data": {"type": "shared_prefix", "shared_prefix": {"enable_multi_turn_chat": True}}},
     "multi-turn chat is not modelled"),
    ({"load": STAGES, "data": {"type": "shared_prefix", "shared_prefix": {"groupz": 3}}}, "groupz: Extra inputs"),
    ({"load": dict(STAGES, lora_traffic_split=[{"name": "a", "split": 1.0}]), "data": {"type": "shared_prefix"}},
     "LoRA adapters are not modelled"),
    ({"load": STAGES, "data": {"type": "random"}}, "data.input_distribution with a total_count is required"),
    ({"load": STAGES, "data": {"type": "random", "input_distribution": {"total_count": 5},
                               "output_distribution": {"total_count": 5}}}, "a stage sends 26 requests but"),
    ({"load": STAGES, "data": {"type": "shared_prefix", "shared_prefix": {
        "question_len": {"min": 50, "max": 10}}}}, "min (50) is greater than max (10)"),
    ({"load": STAGES, "data": {"type": "shared_prefix"}, "loadgen": {}}, "loadgen: Extra inputs are not permitted"),
])
def test_what_it_cannot_model_is_refused_in_one_line(config, message):
    with pytest.raises(JaxrouteError) as e:
        ip.load(config)
    assert message in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_bad_files_are_refused(tmp_path):
    with pytest.raises(JaxrouteError, match="not found"):
        ip.load(tmp_path / "missing.yml")
    (tmp_path / "bad.yml").write_text("load: [unclosed\n")
    with pytest.raises(JaxrouteError, match="bad.yml: not valid YAML"):
        ip.load(tmp_path / "bad.yml")
    (tmp_path / "list.yml").write_text(yaml.safe_dump([1, 2]))
    with pytest.raises(JaxrouteError, match="expected a mapping"):
        ip.load(tmp_path / "list.yml")
