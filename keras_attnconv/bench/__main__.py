"""Worker entry point: `python -m keras_attnconv.bench KIND CASE_JSON` prints one case's result as JSON."""

import json
import sys

from keras_attnconv.bench.clusters_suite import graph_step_case
from keras_attnconv.bench.cpu_suite import layer_memory, model_memory, model_steps_case
from keras_attnconv.bench.gpu_suite import measure_case, measure_references
from keras_attnconv.bench.plan_suite import plan_case
from keras_attnconv.bench.profile_suite import profile_case
from keras_attnconv.bench.scale_suite import measure_scale_case

WORKERS = {
    "layer-memory": layer_memory,
    "model-memory": model_memory,
    "gpu-case": measure_case,
    "gpu-references": measure_references,
    "scale-case": measure_scale_case,
    "profile-case": profile_case,
    "plan-case": plan_case,
    "graph-step": graph_step_case,
    "model-steps": model_steps_case,
}

if __name__ == "__main__":
    kind, case = sys.argv[1:3]
    print(json.dumps(WORKERS[kind](**json.loads(case))))
