"""Compressed bodies and messages with Triton's own Python clients.

Usage: triton_compression.py HTTP_HOST:PORT GRPC_HOST:PORT MODEL
MODEL takes one FP32 input of shape [batch, 4] (y = x + 1). Over HTTP, for gzip and
deflate: a request body compressed by tritonclient (request_compression_algorithm),
an answer compressed on request (response_compression_algorithm), and both; over gRPC
(compression_algorithm) gzip and deflate. Then a corrupt gzip body and an unknown
encoding sent by hand, and answers asked for with Accept-Encoding (their
Content-Encoding checked, then inflated by hand). Prints one JSON line with what it saw; exits non-zero on any
failure.
"""
import gzip
import json
import sys
import urllib.error
import urllib.request
import zlib

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient


def infer_http(client, model, x, request, response):
    tensor = httpclient.InferInput("x", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x, binary_data=False)
    result = client.infer(model, [tensor], request_compression_algorithm=request, response_compression_algorithm=response)
    return result.as_numpy("y").flatten().tolist()


def infer_grpc(client, model, x, algorithm):
    tensor = grpcclient.InferInput("x", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x)
    return client.infer(model, [tensor], compression_algorithm=algorithm).as_numpy("y").flatten().tolist()


def raw(address, model, body, encoding):
    request = urllib.request.Request(
        f"http://{address}/v2/models/{model}/infer", data=body, method="POST",
        headers={"Content-Type": "application/json", "Content-Encoding": encoding},
    )
    try:
        with urllib.request.urlopen(request) as answer:
            return {"status": answer.status, "body": answer.read().decode()}
    except urllib.error.HTTPError as error:
        return {"status": error.code, "body": error.read().decode()}


def accepted(address, model, body, encoding):
    """An answer asked for in `encoding`: the header it came with, and its content."""
    request = urllib.request.Request(
        f"http://{address}/v2/models/{model}/infer", data=body, method="POST",
        headers={"Content-Type": "application/json", "Accept-Encoding": encoding},
    )
    with urllib.request.urlopen(request) as answer:
        content = answer.read()
        header = answer.headers.get("Content-Encoding")
    plain = gzip.decompress(content) if header == "gzip" else zlib.decompress(content) if header == "deflate" else content
    return {"content_encoding": header, "y": json.loads(plain)["outputs"][0]["data"]}


def main():
    http_address, grpc_address, model = sys.argv[1:4]
    x = np.array([[1, 2, 3, 4]], dtype=np.float32)
    seen = {"http": {}, "grpc": {}}
    http = httpclient.InferenceServerClient(http_address)
    for request, response in [("gzip", None), ("deflate", None), (None, "gzip"), (None, "deflate"), ("gzip", "deflate")]:
        seen["http"][f"{request}-{response}"] = infer_http(http, model, x, request, response)
    grpc = grpcclient.InferenceServerClient(grpc_address)
    for algorithm in ["gzip", "deflate"]:
        seen["grpc"][algorithm] = infer_grpc(grpc, model, x, algorithm)
    body = json.dumps({"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]}).encode()
    seen["corrupt"] = raw(http_address, model, gzip.compress(body)[:-12] + b"garbage!", "gzip")
    seen["unknown"] = raw(http_address, model, body, "br")
    seen["accept"] = {encoding: accepted(http_address, model, body, encoding) for encoding in ["gzip", "deflate"]}
    print(json.dumps(seen))


if __name__ == "__main__":
    main()
