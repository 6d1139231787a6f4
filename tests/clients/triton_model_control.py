"""Loads and unloads models of a server started with `--model-control-mode explicit`,
with Triton's own Python HTTP client (tritonclient), the way a Triton user would.

Usage: triton_model_control.py HOST:PORT
The repository holds `add` (y = x + 1), `keep` (the same graph) and the ensemble
`twice` (`add` then `keep`). Unloading `add` alone is refused while `twice` runs it;
with `unload_dependents` both go; loading them again serves them again; loading a model
the repository lacks is refused; `keep` loads with a configuration in the request, a
malformed one is refused, and a plain load reads the folder's again. Prints one JSON line with what it saw; exits
non-zero on any unexpected answer.
"""
import json
import sys

import numpy as np
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException


def infer(client, model):
    tensor = httpclient.InferInput("x", [1, 4], "FP32")
    tensor.set_data_from_numpy(np.arange(4, dtype=np.float32).reshape([1, 4]), binary_data=True)
    return client.infer(model, [tensor]).as_numpy("y").flatten().tolist()


def refusal(call):
    try:
        call()
        return None
    except InferenceServerException as error:
        return {"status": error.status(), "message": error.message()}


def states(client):
    return {m["name"]: m["state"] for m in client.get_model_repository_index()}


def main() -> None:
    client = httpclient.InferenceServerClient(url=sys.argv[1], network_timeout=120.0)
    seen = {"before": states(client), "twice": infer(client, "twice")}
    seen["unload_alone"] = refusal(lambda: client.unload_model("add"))
    client.unload_model("add", unload_dependents=True)
    seen["unloaded"] = states(client)
    seen["add_ready"] = client.is_model_ready("add")
    seen["infer_unloaded"] = refusal(lambda: infer(client, "add"))
    seen["keep_meanwhile"] = infer(client, "keep")
    client.load_model("add")
    client.load_model("twice")
    seen["reloaded"] = states(client)
    seen["add_again"] = infer(client, "add")
    seen["twice_again"] = infer(client, "twice")
    seen["load_missing"] = refusal(lambda: client.load_model("no_such_model"))
    # A configuration in the load request, as Triton's client sends it: this load only.
    config = client.get_model_config("keep")
    seen["keep_batch_before"] = config["max_batch_size"]
    config["max_batch_size"] = 2
    config["parameters"] = {"yardmaster.slo_ms": {"string_value": "321"}}
    client.load_model("keep", config=json.dumps(config))
    changed = client.get_model_config("keep")
    seen["keep_configured"] = {"max_batch_size": changed["max_batch_size"], "parameters": changed.get("parameters")}
    seen["keep_configured_infer"] = infer(client, "keep")
    seen["twice_after_config"] = infer(client, "twice")
    seen["bad_config"] = refusal(lambda: client.load_model("keep", config=json.dumps({"max_batch_size": "many"})))
    seen["keep_after_bad_config"] = client.get_model_config("keep")["max_batch_size"]
    client.load_model("keep")
    seen["keep_batch_reloaded"] = client.get_model_config("keep")["max_batch_size"]
    print(json.dumps(seen))


if __name__ == "__main__":
    main()
