"""Drives `yardmaster serve` over KServe v2 gRPC with Triton's own Python gRPC client
(tritonclient.grpc), the way a Triton user would.

Usage: triton_grpc.py HOST:PORT CONTROLLED MODEL...
For each MODEL: readiness, metadata, configuration, one inference built from the
metadata alone (inputs of the declared type filled with a ramp, the batch dimension 1,
other variable dimensions 4, sent as raw contents), then its statistics. Then: a
request with a wrong shape and one to an unknown model (each must be refused with
the right gRPC code and a reason), three requests on one bidirectional stream
(answered by id), the repository index, and model control on CONTROLLED: unload it
(then it is not ready and a request to it is refused), load it again with a changed
configuration (max_batch_size 2), which its configuration then shows. Prints one JSON
line with what it saw; exits non-zero on any failure.
"""
import json
import queue
import sys
import time

import numpy as np
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException, triton_to_np_dtype


def build_inputs(metadata, config):
    inputs = []
    for spec in metadata["inputs"]:
        shape = [int(d) if int(d) >= 0 else 4 for d in spec["shape"]]
        if int(config.get("max_batch_size", 0)) > 0:
            shape[0] = 1
        data = (np.arange(int(np.prod(shape))) % 7).astype(triton_to_np_dtype(spec["datatype"])).reshape(shape)
        tensor = grpcclient.InferInput(spec["name"], shape, spec["datatype"])
        tensor.set_data_from_numpy(data)
        inputs.append(tensor)
    return inputs


def summary(result, metadata):
    return {
        o["name"]: {"shape": list(result.as_numpy(o["name"]).shape), "data": result.as_numpy(o["name"]).flatten()[:16].tolist()}
        for o in metadata["outputs"]
    }


def refusal(call):
    try:
        call()
    except InferenceServerException as e:
        return {"status": str(e.status()), "message": e.message()}
    raise AssertionError("the call was not refused")


def main() -> None:
    url, controlled, models = sys.argv[1], sys.argv[2], sys.argv[3:]
    client = grpcclient.InferenceServerClient(url=url)
    deadline = time.monotonic() + 60
    while not client.is_server_ready():
        assert time.monotonic() < deadline, "server not ready after 60 s"
        time.sleep(0.1)
    assert client.is_server_live()
    seen = {"server": client.get_server_metadata(as_json=True), "models": {}}
    for model in models:
        assert client.is_model_ready(model), f"model {model} not ready"
        metadata = client.get_model_metadata(model, as_json=True)
        config = client.get_model_config(model, as_json=True)["config"]
        wanted = [grpcclient.InferRequestedOutput(o["name"]) for o in metadata["outputs"]]
        result = client.infer(model, build_inputs(metadata, config), outputs=wanted, request_id="r-" + model,
                              headers={"x-yardmaster-key": "tenant-a"})
        stats = client.get_inference_statistics(model, as_json=True)
        seen["models"][model] = {
            "metadata": metadata,
            "config": config,
            "outputs": summary(result, metadata),
            "id": result.get_response().id,
            "stats": stats,
        }
    model = models[0]
    metadata = seen["models"][model]["metadata"]
    spec = metadata["inputs"][0]
    wrong = grpcclient.InferInput(spec["name"], [1, 99], spec["datatype"])
    wrong.set_data_from_numpy(np.zeros([1, 99], dtype=triton_to_np_dtype(spec["datatype"])))
    seen["wrong_shape"] = refusal(lambda: client.infer(model, [wrong]))
    seen["unknown_model"] = refusal(lambda: client.infer("no_such_model", [wrong]))

    # Three requests on one stream, answered by id.
    answers = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    config = seen["models"][model]["config"]
    for i in range(3):
        client.async_stream_infer(model, build_inputs(metadata, config), request_id=f"s{i}")
    streamed = {}
    for _ in range(3):
        result, error = answers.get(timeout=60)
        assert error is None, f"stream error: {error}"
        response = result.get_response()
        streamed[response.id] = summary(result, metadata)
    client.stop_stream()
    seen["streamed"] = streamed

    seen["index"] = client.get_model_repository_index(as_json=True).get("models", [])

    # Model control on CONTROLLED.
    client.unload_model(controlled)
    deadline = time.monotonic() + 30
    while client.is_model_ready(controlled):
        assert time.monotonic() < deadline, f"{controlled} still ready after unload"
        time.sleep(0.1)
    seen["unloaded_infer"] = refusal(lambda: client.infer(controlled, [wrong]))
    changed = json.dumps({"name": controlled, "max_batch_size": 2})
    client.load_model(controlled, config=changed)
    # Ready within 30 s (seen not ready at once on a machine loaded by parallel builds).
    deadline = time.monotonic() + 30
    while not client.is_model_ready(controlled):
        assert time.monotonic() < deadline, f"{controlled} not ready after load"
        time.sleep(0.1)
    seen["reloaded_config"] = client.get_model_config(controlled, as_json=True)["config"]
    seen["bad_load"] = refusal(lambda: client.load_model(controlled, config=json.dumps({"max_batch_size": "many"})))
    print(json.dumps(seen))


if __name__ == "__main__":
    main()
