"""A decoupled model over gRPC streaming with Triton's own Python client.

Usage: triton_decoupled.py HTTP_HOST:PORT GRPC_HOST:PORT MODEL
MODEL is decoupled (model_transaction_policy { decoupled: true }) and answers an INT32
input IN of shape [n] with n responses, each one element of OUT (IN's values, in order)
and IDX (0..n-1). Over one stream: requests of 3, 1 and 0 elements with
enable_empty_final_response (each: its rows flagged not final, then an empty final
response), the same 3 without it (the last row final), and a request that fails (a
wrong input name). Then plain ModelInfer and HTTP infer, which must refuse a decoupled
model, and finally a request of 20,000 rows whose stream is closed with
cancel_requests after ten responses (it must end exactly once on the server: the
caller checks the metrics). Prints one JSON
line with what it saw; exits non-zero on any unexpected failure.
"""
import json
import queue
import sys
import urllib.error
import urllib.request

import numpy as np
import tritonclient.grpc as grpcclient


def request_input(values, name="IN"):
    tensor = grpcclient.InferInput(name, [len(values)], "INT32")
    tensor.set_data_from_numpy(np.array(values, dtype=np.int32))
    return tensor


def main():
    http, grpc_address, model = sys.argv[1:4]
    client = grpcclient.InferenceServerClient(grpc_address)
    seen = {}
    answers = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))

    def collect(request_id, values, empty_final, name="IN"):
        client.async_stream_infer(model, [request_input(values, name)], request_id=request_id, enable_empty_final_response=empty_final)
        got = []
        while True:
            result, error = answers.get(timeout=30)
            if error is not None:
                got.append({"error": str(error)})
                return got
            response = result.get_response()
            final = response.parameters["triton_final_response"].bool_param
            entry = {"id": response.id, "final": final, "outputs": [o.name for o in response.outputs]}
            if response.outputs:
                entry["OUT"] = result.as_numpy("OUT").tolist()
                entry["IDX"] = result.as_numpy("IDX").tolist()
            got.append(entry)
            if final:
                return got

    seen["three"] = collect("r3", [7, 8, 9], True)
    seen["one"] = collect("r1", [5], True)
    seen["zero"] = collect("r0", [], True)
    seen["three_plain"] = collect("p3", [7, 8, 9], False)
    seen["wrong_input"] = collect("bad", [1], True, name="NOT_AN_INPUT")
    client.stop_stream()

    try:
        client.infer(model, [request_input([1, 2])])
        seen["unary"] = "served"
    except Exception as error:  # tritonclient raises InferenceServerException
        seen["unary"] = str(error)
    body = json.dumps({"inputs": [{"name": "IN", "shape": [2], "datatype": "INT32", "data": [1, 2]}]}).encode()
    request = urllib.request.Request(f"http://{http}/v2/models/{model}/infer", data=body, method="POST")
    try:
        urllib.request.urlopen(request)
        seen["http"] = {"status": 200}
    except urllib.error.HTTPError as error:
        seen["http"] = {"status": error.code, "body": error.read().decode()}

    # A request of 20,000 rows, its stream closed with the request cancelled after ten
    # responses: the server stops sending, and the request ends once.
    received = queue.Queue()
    client.start_stream(callback=lambda result, error: received.put(error))
    client.async_stream_infer(model, [request_input(list(range(20000)))], request_id="long", enable_empty_final_response=True)
    errors = [received.get(timeout=30) for _ in range(10)]
    client.stop_stream(cancel_requests=True)
    seen["cancelled"] = {"errors": [str(e) for e in errors if e is not None], "received_before_close": 10 + received.qsize()}
    print(json.dumps(seen))


if __name__ == "__main__":
    main()
