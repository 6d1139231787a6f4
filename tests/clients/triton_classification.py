"""Triton's classification extension with its own Python clients.

Usage: triton_classification.py HTTP_HOST:PORT GRPC_HOST:PORT MODEL INPUT_JSON
INPUT_JSON holds {"input": NAME, "datatype": TYPE, "shape": [...], "data": [...],
"output": NAME, "class_count": K}. The request asks for OUTPUT with class_count K over
HTTP (JSON and binary answers) and gRPC; then a class_count that is not a number.
Prints one JSON line with the BYTES each answer carried; exits non-zero on a failure.
"""
import json
import sys
import urllib.error
import urllib.request

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient


def main():
    http, grpc_address, model, path = sys.argv[1:5]
    spec = json.load(open(path))
    data = np.array(spec["data"], dtype=np.int32 if spec["datatype"] == "INT32" else np.float32).reshape(spec["shape"])
    seen = {}

    client = httpclient.InferenceServerClient(http)
    for binary in (False, True):
        tensor = httpclient.InferInput(spec["input"], list(data.shape), spec["datatype"])
        tensor.set_data_from_numpy(data, binary_data=binary)
        wanted = httpclient.InferRequestedOutput(spec["output"], binary_data=binary, class_count=spec["class_count"])
        result = client.infer(model, [tensor], outputs=[wanted])
        answer = result.as_numpy(spec["output"])
        seen["http_binary" if binary else "http_json"] = [[v.decode() if isinstance(v, bytes) else v for v in row] for row in answer.tolist()]

    grpc = grpcclient.InferenceServerClient(grpc_address)
    tensor = grpcclient.InferInput(spec["input"], list(data.shape), spec["datatype"])
    tensor.set_data_from_numpy(data)
    result = grpc.infer(model, [tensor], outputs=[grpcclient.InferRequestedOutput(spec["output"], class_count=spec["class_count"])])
    seen["grpc"] = [[v.decode() for v in row] for row in result.as_numpy(spec["output"]).tolist()]

    body = {"inputs": [{"name": spec["input"], "shape": list(data.shape), "datatype": spec["datatype"], "data": data.flatten().tolist()}],
            "outputs": [{"name": spec["output"], "parameters": {"classification": "three"}}]}
    request = urllib.request.Request(f"http://{http}/v2/models/{model}/infer", data=json.dumps(body).encode(), method="POST")
    try:
        urllib.request.urlopen(request)
        seen["bad"] = {"status": 200}
    except urllib.error.HTTPError as error:
        seen["bad"] = {"status": error.code, "body": error.read().decode()}
    print(json.dumps(seen))


if __name__ == "__main__":
    main()
