"""Triton's logging extension with Triton's own Python clients.

Usage: triton_logging.py HTTP_HOST:PORT GRPC_HOST:PORT MODEL STDERR_FILE
Reads the log settings over HTTP, infers once (the server's log, STDERR_FILE, must
not show debug records), raises log_verbose_level to 1 over HTTP, infers again (now
it must), reads the settings back over gRPC, lowers the level over gRPC, and tries a
setting the server refuses. MODEL takes one FP32 input x of shape [batch, 4]. Prints
one JSON line with what it saw; exits non-zero on any failure.
"""
import json
import sys
import time

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException


def infer(client, model):
    tensor = httpclient.InferInput("x", [1, 4], "FP32")
    tensor.set_data_from_numpy(np.array([[1, 2, 3, 4]], dtype=np.float32))
    client.infer(model, [tensor])


def debug_records(path):
    time.sleep(0.3)
    with open(path, encoding="utf-8", errors="replace") as log:
        return sum(1 for line in log if "DEBUG" in line)


def main():
    http_address, grpc_address, model, stderr = sys.argv[1:5]
    http = httpclient.InferenceServerClient(http_address)
    grpc = grpcclient.InferenceServerClient(grpc_address)
    seen = {"initial": http.get_log_settings()}
    infer(http, model)
    seen["debug_before"] = debug_records(stderr)
    seen["raised"] = http.update_log_settings({"log_verbose_level": 1})
    infer(http, model)
    seen["debug_after"] = debug_records(stderr)
    seen["grpc_read"] = grpc.get_log_settings(as_json=True)
    seen["grpc_lowered"] = grpc.update_log_settings({"log_verbose_level": 0}, as_json=True)
    try:
        http.update_log_settings({"log_file": "/tmp/elsewhere.log"})
        seen["refused"] = None
    except InferenceServerException as error:
        seen["refused"] = error.message()
    print(json.dumps(seen))


if __name__ == "__main__":
    main()
