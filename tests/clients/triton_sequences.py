"""Stateful sequences with Triton's own clients: sequence_id, sequence_start and
sequence_end over HTTP and gRPC.

Usage: triton_sequences.py HTTP_HOST:PORT GRPC_HOST:PORT PLAN.json
PLAN is a list of steps, sent one after another, each
{"transport": "http"|"grpc", "model": M, "sequence_id": int|str|null, "start": bool,
 "end": bool, "inputs": {NAME: {"datatype": T, "shape": [...], "hex": "..."}},
 "outputs": [NAME, ...]}
(BYTES inputs as Triton's binary layout). Prints one JSON line: for each step, either
{"outputs": {NAME: {"shape": [...], "hex": "..."}}} or {"error": message, "status": code}.
"""
import json
import struct
import sys

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException, triton_to_np_dtype

def array(spec):
    raw = bytes.fromhex(spec["hex"])
    if spec["datatype"] == "BYTES":
        items, at = [], 0
        while at < len(raw):
            (n,) = struct.unpack_from("<I", raw, at)
            items.append(raw[at + 4 : at + 4 + n])
            at += 4 + n
        return np.array(items, dtype=np.object_).reshape(spec["shape"])
    return np.frombuffer(raw, dtype=triton_to_np_dtype(spec["datatype"])).reshape(spec["shape"])


def layout(value):
    if value.dtype == np.object_:
        return b"".join(struct.pack("<I", len(s)) + s for s in value.flatten().tolist())
    return value.tobytes()


def main():
    http, grpc_address, plan_file = sys.argv[1:4]
    with open(plan_file) as f:
        plan = json.load(f)
    clients = {
        "http": (httpclient, httpclient.InferenceServerClient(http)),
        "grpc": (grpcclient, grpcclient.InferenceServerClient(grpc_address)),
    }
    seen = []
    for step in plan:
        module, client = clients[step["transport"]]
        tensors = []
        for name, spec in step["inputs"].items():
            tensor = module.InferInput(name, list(spec["shape"]), spec["datatype"])
            tensor.set_data_from_numpy(array(spec))
            tensors.append(tensor)
        outputs = [module.InferRequestedOutput(name) for name in step["outputs"]]
        sequence_id = step.get("sequence_id")
        try:
            result = client.infer(
                step["model"],
                tensors,
                outputs=outputs,
                sequence_id=0 if sequence_id is None else sequence_id,
                sequence_start=step.get("start", False),
                sequence_end=step.get("end", False),
            )
            answer = {name: {"shape": list(result.as_numpy(name).shape), "hex": layout(result.as_numpy(name)).hex()} for name in step["outputs"]}
            seen.append({"outputs": answer})
        except InferenceServerException as e:
            seen.append({"error": e.message(), "status": str(e.status())})
    print(json.dumps(seen))


if __name__ == "__main__":
    main()
