"""Talks to `yardmaster serve` with Triton's own Python HTTP client (tritonclient).

Usage: triton_http.py HOST:PORT MODEL
Checks liveness, readiness, server and model metadata, then runs one inference with
JSON tensors and one with the binary-tensor extension, built from the model's metadata
(FP32 inputs filled with a ramp, variable dimensions taken as 4). Prints one JSON line
with what it saw; exits non-zero on any failure.
"""
import json
import sys
import time

import numpy as np
import tritonclient.http as httpclient

NUMPY = {"FP32": np.float32, "FP64": np.float64, "INT32": np.int32, "INT64": np.int64, "UINT8": np.uint8}


def main() -> None:
    url, model = sys.argv[1], sys.argv[2]
    client = httpclient.InferenceServerClient(url=url, network_timeout=60.0)
    assert client.is_server_live(), "server not live"
    # The server listens before its workers are up: wait for readiness, as clients do.
    deadline = time.monotonic() + 60
    while not client.is_server_ready():
        assert time.monotonic() < deadline, "server not ready after 60 s"
        time.sleep(0.1)
    server = client.get_server_metadata()
    metadata = client.get_model_metadata(model)
    assert client.is_model_ready(model), f"model {model} not ready"
    outputs = {}
    for binary in (False, True):
        inputs = []
        for spec in metadata["inputs"]:
            # One item per request: a leading dimension of any size is 1, others 4.
            shape = [d if d >= 0 else (1 if i == 0 else 4) for i, d in enumerate(spec["shape"])]
            data = (np.arange(int(np.prod(shape))) % 7).astype(NUMPY[spec["datatype"]]).reshape(shape)
            tensor = httpclient.InferInput(spec["name"], shape, spec["datatype"])
            tensor.set_data_from_numpy(data, binary_data=binary)
            inputs.append(tensor)
        wanted = [httpclient.InferRequestedOutput(o["name"], binary_data=binary) for o in metadata["outputs"]]
        result = client.infer(model, inputs, outputs=wanted, request_id=f"req-{int(binary)}")
        outputs["binary" if binary else "json"] = {
            o["name"]: result.as_numpy(o["name"]).flatten().tolist() for o in metadata["outputs"]
        }
    print(json.dumps({"server": server, "model": metadata, "outputs": outputs}))


if __name__ == "__main__":
    main()
