"""Reads a model repository served by `yardmaster serve --model-repository` with Triton's
own Python HTTP client (tritonclient), the way a Triton user would.

Usage: triton_repository.py HOST:PORT MODEL...
For each model: readiness, metadata, configuration (`get_model_config`), one inference
built from the metadata alone (inputs of the declared type filled with a ramp, the
batch dimension 1, other variable dimensions 4), then the statistics (`get_inference_statistics`); then a
request with a wrong shape, which must be refused with a reason; the repository index
(`get_model_repository_index`) and a `load_model`, which this server refuses with the
reason. Prints one JSON line
with what it saw; exits non-zero on any failure.
"""
import json
import sys
import time

import numpy as np
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException, triton_to_np_dtype


def infer(client, model, metadata, config, version=""):
    inputs = []
    for spec in metadata["inputs"]:
        shape = [d if d >= 0 else 4 for d in spec["shape"]]
        if config.get("max_batch_size", 0) > 0:
            shape[0] = 1
        data = (np.arange(int(np.prod(shape))) % 7).astype(triton_to_np_dtype(spec["datatype"])).reshape(shape)
        tensor = httpclient.InferInput(spec["name"], shape, spec["datatype"])
        tensor.set_data_from_numpy(data, binary_data=True)
        inputs.append(tensor)
    wanted = [httpclient.InferRequestedOutput(o["name"], binary_data=True) for o in metadata["outputs"]]
    result = client.infer(model, inputs, outputs=wanted, model_version=version)
    return {
        o["name"]: {"shape": list(result.as_numpy(o["name"]).shape), "data": result.as_numpy(o["name"]).flatten()[:16].tolist()}
        for o in metadata["outputs"]
    }


def main() -> None:
    url, models = sys.argv[1], sys.argv[2:]
    client = httpclient.InferenceServerClient(url=url, network_timeout=60.0)
    # The server listens before its workers are up: wait for readiness, as clients do.
    deadline = time.monotonic() + 60
    while not client.is_server_ready():
        assert time.monotonic() < deadline, "server not ready after 60 s"
        time.sleep(0.1)
    seen = {"server": client.get_server_metadata(), "models": {}}
    for model in models:
        assert client.is_model_ready(model), f"model {model} not ready"
        metadata = client.get_model_metadata(model)
        config = client.get_model_config(model)
        outputs = infer(client, model, metadata, config)
        stats = client.get_inference_statistics(model)
        seen["models"][model] = {"metadata": metadata, "config": config, "outputs": outputs, "stats": stats}
        if len(metadata["versions"]) > 1:
            oldest = metadata["versions"][0]
            seen["models"][model]["oldest_version_outputs"] = infer(client, model, metadata, config, version=oldest)
    model = models[0]
    metadata = seen["models"][model]["metadata"]
    spec = metadata["inputs"][0]
    wrong = httpclient.InferInput(spec["name"], [1, 3], spec["datatype"])
    wrong.set_data_from_numpy(np.zeros([1, 3], dtype=np.float32))
    try:
        client.infer(model, [wrong])
        seen["wrong_shape"] = None
    except InferenceServerException as error:
        seen["wrong_shape"] = {"status": error.status(), "message": error.message()}
    seen["index"] = client.get_model_repository_index()
    try:
        client.load_model(models[0])
        seen["load"] = None
    except InferenceServerException as error:
        seen["load"] = {"status": error.status(), "message": error.message()}
    print(json.dumps(seen))


if __name__ == "__main__":
    main()
