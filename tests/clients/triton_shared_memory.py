"""System shared memory with Triton's own Python clients and its shared-memory
utilities (tritonclient.utils.shared_memory), over HTTP and gRPC.

Usage: triton_shared_memory.py HTTP_HOST:PORT GRPC_HOST:PORT MODEL
MODEL takes one FP32 input x of shape [batch, 4] and answers y = x + 1. Creates an
input and an output region, registers them, reads the status, infers with the input
read from and the output written into shared memory (and once plainly, to compare),
then the bad cases: a byte size past the region, an unregistered region, a key that
does not exist; then unregisters everything. Then the same inference over gRPC, and
CUDA shared memory refused with a reason that names it. Prints one JSON line with what it saw;
exits non-zero on any failure.
"""
import json
import os
import sys

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException


def refusal(call):
    try:
        call()
    except InferenceServerException as error:
        return error.message()
    raise AssertionError("the call was not refused")


def main():
    address, grpc_address, model = sys.argv[1:4]
    client = httpclient.InferenceServerClient(address)
    client.unregister_system_shared_memory()
    x = np.array([[1, 2, 3, 4]], dtype=np.float32)
    size = x.nbytes
    suffix = os.getpid()
    input_handle = shm.create_shared_memory_region("input", f"/ym_input_{suffix}", size)
    output_handle = shm.create_shared_memory_region("output", f"/ym_output_{suffix}", size)
    seen = {}
    try:
        shm.set_shared_memory_region(input_handle, [x])
        client.register_system_shared_memory("input", f"/ym_input_{suffix}", size)
        client.register_system_shared_memory("output", f"/ym_output_{suffix}", size)
        seen["status"] = sorted(r["name"] for r in client.get_system_shared_memory_status())

        tensor = httpclient.InferInput("x", [1, 4], "FP32")
        tensor.set_shared_memory("input", size)
        wanted = httpclient.InferRequestedOutput("y", binary_data=True)
        wanted.set_shared_memory("output", size)
        result = client.infer(model, [tensor], outputs=[wanted])
        output = result.get_output("y")
        seen["output_entry"] = sorted(output.keys())
        seen["y_from_shared_memory"] = shm.get_contents_as_numpy(output_handle, np.float32, [1, 4]).flatten().tolist()
        plain = httpclient.InferInput("x", [1, 4], "FP32")
        plain.set_data_from_numpy(x)
        seen["y_plain"] = client.infer(model, [plain]).as_numpy("y").flatten().tolist()

        too_big = httpclient.InferInput("x", [1, 4], "FP32")
        too_big.set_shared_memory("input", size, offset=8)
        seen["past_the_region"] = refusal(lambda: client.infer(model, [too_big]))
        client.unregister_system_shared_memory("input")
        seen["after_unregister"] = refusal(lambda: client.infer(model, [tensor]))
        seen["missing_key"] = refusal(lambda: client.register_system_shared_memory("nope", f"/ym_missing_{suffix}", 16))
        client.unregister_system_shared_memory()
        seen["status_after"] = client.get_system_shared_memory_status()

        grpc = grpcclient.InferenceServerClient(grpc_address)
        shm.set_shared_memory_region(output_handle, [np.zeros_like(x)])
        grpc.register_system_shared_memory("input", f"/ym_input_{suffix}", size)
        grpc.register_system_shared_memory("output", f"/ym_output_{suffix}", size)
        status = grpc.get_system_shared_memory_status(as_json=True)
        seen["grpc_status"] = sorted(status.get("regions", {}).keys())
        tensor = grpcclient.InferInput("x", [1, 4], "FP32")
        tensor.set_shared_memory("input", size)
        wanted = grpcclient.InferRequestedOutput("y")
        wanted.set_shared_memory("output", size)
        grpc.infer(model, [tensor], outputs=[wanted])
        seen["grpc_y_from_shared_memory"] = shm.get_contents_as_numpy(output_handle, np.float32, [1, 4]).flatten().tolist()
        grpc.unregister_system_shared_memory("input")
        seen["grpc_after_unregister"] = refusal(lambda: grpc.infer(model, [tensor], outputs=[wanted]))
        grpc.unregister_system_shared_memory()
        seen["grpc_status_after"] = grpc.get_system_shared_memory_status(as_json=True).get("regions", {})
        seen["grpc_cuda_status"] = grpc.get_cuda_shared_memory_status(as_json=True).get("regions", {})
        seen["grpc_cuda_register"] = refusal(lambda: grpc.register_cuda_shared_memory("gpu", b"aGFuZGxl", 0, 16))
        seen["http_cuda_register"] = refusal(lambda: client.register_cuda_shared_memory("gpu", b"aGFuZGxl", 0, 16))
    finally:
        shm.destroy_shared_memory_region(input_handle)
        shm.destroy_shared_memory_region(output_handle)
    print(json.dumps(seen))


if __name__ == "__main__":
    main()
