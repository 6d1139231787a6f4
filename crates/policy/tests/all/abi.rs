//! The canonical-ABI layouts written by hand — the fast event lowering's constants
//! (`yardmaster_policy::abi`, against the latest contract) and the Zig example's
//! `canonical_layouts` table (against the version `abi.zig` names) — checked against
//! the layout the contract's WIT defines, computed with wit-parser's
//! `SizeAlign` (the wit-parser wasmtime's `bindgen!` uses). A contract change that moves
//! a field fails here instead of silently misaligning a policy's memory.

use std::path::{Path, PathBuf};

use wit_parser::{Resolve, SizeAlign, Type, TypeDefKind, TypeId};
use yardmaster_policy::abi;
use yardmaster_policy::contract::LATEST;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// A contract version, resolved, with its sizes and alignments.
struct Contract {
    resolve: Resolve,
    sizes: SizeAlign,
    types: wit_parser::InterfaceId,
    policy: wit_parser::InterfaceId,
}

/// A type's canonical layout on wasm32: size, alignment, and the offsets of its parts
/// (a record's or tuple's fields; a variant's, option's or result's discriminant and
/// payload).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Layout {
    size: usize,
    align: usize,
    offsets: Vec<usize>,
}

impl Contract {
    fn load(version: &str) -> Self {
        let dir = root().join("wit").join(version);
        let mut resolve = Resolve::default();
        let (package, _) = resolve.push_dir(&dir).unwrap_or_else(|e| panic!("{}: {e:#}", dir.display()));
        let interface = |name: &str| *resolve.packages[package].interfaces.get(name).unwrap_or_else(|| panic!("no interface {name}"));
        let (types, policy) = (interface("types"), interface("policy"));
        let mut sizes = SizeAlign::default();
        sizes.fill(&resolve);
        Self { resolve, sizes, types, policy }
    }

    /// A type of the `types` interface by its WIT name.
    fn named(&self, name: &str) -> TypeId {
        *self.resolve.interfaces[self.types].types.get(name).unwrap_or_else(|| panic!("no type {name} in the types interface"))
    }

    /// A type by the names `abi.zig` uses: `TYPE`, `TYPE.MEMBER` (a record's field or a
    /// variant's case payload) or `FUNC()` (the result of a `policy` function).
    fn lookup(&self, name: &str) -> Type {
        if let Some(function) = name.strip_suffix("()") {
            let function = self.resolve.interfaces[self.policy].functions.get(function).unwrap_or_else(|| panic!("no function {function}"));
            return function.result.unwrap_or_else(|| panic!("{name} has no result"));
        }
        let Some((owner, member)) = name.split_once('.') else { return Type::Id(self.named(name)) };
        match &self.resolve.types[self.named(owner)].kind {
            TypeDefKind::Record(record) => record.fields.iter().find(|f| f.name == member).map(|f| f.ty),
            TypeDefKind::Variant(variant) => variant.cases.iter().find(|c| c.name == member).and_then(|c| c.ty),
            other => panic!("{owner} is a {other:?}, not a record or variant"),
        }
        .unwrap_or_else(|| panic!("no member {member} with a type in {owner}"))
    }

    /// The canonical layout of a type.
    fn layout(&self, ty: Type) -> Layout {
        let (size, align) = (self.sizes.size(&ty).size_wasm32(), self.sizes.align(&ty).align_wasm32());
        let offsets = match ty {
            Type::Id(id) => match &self.resolve.types[id].kind {
                TypeDefKind::Type(alias) => return self.layout(*alias),
                TypeDefKind::Record(record) => self.offsets(record.fields.iter().map(|f| &f.ty)),
                TypeDefKind::Tuple(tuple) => self.offsets(tuple.types.iter()),
                TypeDefKind::Variant(variant) => self.discriminant_and_payload(variant.tag(), variant.cases.iter().map(|c| c.ty.as_ref())),
                TypeDefKind::Option(some) => self.discriminant_and_payload(wit_parser::Int::U8, [Some(some)]),
                TypeDefKind::Result(result) => {
                    self.discriminant_and_payload(wit_parser::Int::U8, [result.ok.as_ref(), result.err.as_ref()])
                }
                _ => Vec::new(),
            },
            _ => Vec::new(),
        };
        Layout { size, align, offsets }
    }

    fn offsets<'a>(&self, types: impl IntoIterator<Item = &'a Type>) -> Vec<usize> {
        self.sizes.field_offsets(types).into_iter().map(|(offset, _)| offset.size_wasm32()).collect()
    }

    fn discriminant_and_payload<'a>(&self, tag: wit_parser::Int, cases: impl IntoIterator<Item = Option<&'a Type>>) -> Vec<usize> {
        vec![0, self.sizes.payload_offset(tag, cases).size_wasm32()]
    }

    /// A record's field offsets by field name.
    fn field_offsets(&self, record: &str) -> Vec<(String, usize)> {
        let TypeDefKind::Record(fields) = &self.resolve.types[self.named(record)].kind else { panic!("{record} is not a record") };
        let offsets = self.offsets(fields.fields.iter().map(|f| &f.ty));
        fields.fields.iter().map(|f| f.name.clone()).zip(offsets).collect()
    }

    /// The index of a case of a variant or enum.
    fn case(&self, owner: &str, case: &str) -> usize {
        let names: Vec<&str> = match &self.resolve.types[self.named(owner)].kind {
            TypeDefKind::Variant(v) => v.cases.iter().map(|c| c.name.as_str()).collect(),
            TypeDefKind::Enum(e) => e.cases.iter().map(|c| c.name.as_str()).collect(),
            other => panic!("{owner} is a {other:?}, not a variant or enum"),
        };
        names.iter().position(|name| *name == case).unwrap_or_else(|| panic!("{owner} has no case {case}"))
    }
}

/// Compare a record's fields, in order, with hand-written `(field, offset)` constants;
/// every field must be listed, so a field added to the record fails too.
fn assert_fields(contract: &Contract, record: &str, written: &[(&str, usize)]) {
    let wit = contract.field_offsets(record);
    let written: Vec<(String, usize)> = written.iter().map(|(name, offset)| (name.to_string(), *offset)).collect();
    assert_eq!(written, wit, "the offsets of `{record}` in yardmaster_policy::abi differ from the WIT's (left: abi.rs, right: WIT)");
}

#[test]
fn the_fast_lowering_constants_match_the_wit() {
    let contract = Contract::load(&LATEST.to_string());

    let event = contract.layout(Type::Id(contract.named("event")));
    assert_eq!((abi::event::SIZE, abi::event::ALIGN, abi::event::PAYLOAD), (event.size, event.align, event.offsets[1]), "event");
    assert_eq!(abi::event::ARRIVAL as usize, contract.case("event", "arrival"));
    assert_eq!(abi::event::WORKER_IDLE as usize, contract.case("event", "worker-idle"));
    assert_eq!(abi::event::BATCH_DONE as usize, contract.case("event", "batch-done"));
    // The payloads the fast path writes are the ones these constants describe.
    assert_eq!(contract.lookup("event.arrival"), Type::Id(contract.named("request")));
    assert_eq!(contract.layout(contract.lookup("event.worker-idle")).size, 4, "worker-idle carries a u32");
    assert_eq!(contract.lookup("event.batch-done"), Type::Id(contract.named("batch-outcome")));

    use abi::request as r;
    let request = contract.layout(Type::Id(contract.named("request")));
    assert_eq!((r::SIZE, r::ALIGN), (request.size, request.align), "request");
    assert_fields(
        &contract,
        "request",
        &[
            ("id", r::ID),
            ("origin", r::ORIGIN),
            ("stage", r::STAGE),
            ("stream", r::STREAM),
            ("sent-at", r::SENT_AT),
            ("arrived-at", r::ARRIVED_AT),
            ("deadline", r::DEADLINE),
            ("priority", r::PRIORITY),
            ("input-size", r::INPUT_SIZE),
            ("expected-tokens", r::EXPECTED_TOKENS),
            ("requeues", r::REQUEUES),
            ("tags", r::TAGS),
            ("items", r::ITEMS),
            ("correlation", r::CORRELATION),
        ],
    );
    let correlation = contract.layout(contract.lookup("request.correlation"));
    assert_eq!(r::CORRELATION + correlation.offsets[1], r::CORRELATION_PAYLOAD, "correlation's option payload");
    use abi::correlation as c;
    let worker = contract.layout(contract.lookup("correlation.worker"));
    assert_eq!(c::WORKER + worker.offsets[1], c::WORKER_ID, "correlation.worker's option payload");
    assert_fields(&contract, "correlation", &[("id", c::ID), ("start", c::START), ("end", c::END), ("worker", c::WORKER)]);

    use abi::batch_outcome as b;
    let outcome = contract.layout(Type::Id(contract.named("batch-outcome")));
    assert_eq!((b::SIZE, b::ALIGN), (outcome.size, outcome.align), "batch-outcome");
    assert_fields(
        &contract,
        "batch-outcome",
        &[("worker", b::WORKER), ("started-at", b::STARTED_AT), ("duration", b::DURATION), ("results", b::RESULTS)],
    );

    use abi::request_result as rr;
    let result = contract.layout(Type::Id(contract.named("request-result")));
    assert_eq!((rr::SIZE, rr::ALIGN), (result.size, result.align), "request-result");
    assert_fields(&contract, "request-result", &[("id", rr::ID), ("status", rr::STATUS), ("tokens", rr::TOKENS)]);
    assert_eq!(rr::STATUS_OK as usize, contract.case("request-status", "ok"));
    assert_eq!(rr::STATUS_FAILED as usize, contract.case("request-status", "failed"));
}

#[test]
fn the_fast_lifting_constants_match_the_wit() {
    let contract = Contract::load(&LATEST.to_string());

    let action = contract.layout(Type::Id(contract.named("action")));
    assert_eq!((abi::action::SIZE, abi::action::ALIGN, abi::action::PAYLOAD), (action.size, action.align, action.offsets[1]), "action");
    assert_eq!(abi::action::DROP as usize, contract.case("action", "drop"));
    assert_eq!(abi::action::DISPATCH as usize, contract.case("action", "dispatch"));
    assert_eq!(contract.lookup("action.drop"), Type::Id(contract.named("drop-request")));
    assert_eq!(contract.lookup("action.dispatch"), Type::Id(contract.named("dispatch")));

    use abi::drop_request as d;
    assert_fields(&contract, "drop-request", &[("request", d::REQUEST), ("reason", d::REASON)]);
    let TypeDefKind::Enum(reasons) = &contract.resolve.types[contract.named("drop-reason")].kind else { panic!("drop-reason is an enum") };
    assert_eq!(d::REASONS as usize, reasons.cases.len(), "drop-reason's cases");
    let order = ["deadline-unreachable", "overload", "queue-full", "preempted", "policy"];
    for (index, case) in order.iter().enumerate() {
        assert_eq!(contract.case("drop-reason", case), index, "the fast lifting reads drop-reason {index} as {case}");
    }

    use abi::dispatch as p;
    assert_fields(&contract, "dispatch", &[("worker", p::WORKER), ("requests", p::REQUESTS), ("variant", p::VARIANT)]);
    let variant = contract.layout(contract.lookup("dispatch.variant"));
    assert_eq!(p::VARIANT + variant.offsets[1], p::VARIANT_ID, "dispatch.variant's option payload");
}

/// One line of `canonical_layouts` in abi.zig.
#[derive(Debug)]
struct ZigLayout {
    zig: String,
    wit: String,
    layout: Layout,
}

/// Parse the `canonical_layouts` table of abi.zig: lines of the form
/// `.{ ZigType, "wit-type", size, alignment, .{ offset, … } },`.
fn zig_layouts(source: &str) -> Vec<ZigLayout> {
    let start = source.find("pub const canonical_layouts = .{").expect("abi.zig has a canonical_layouts table");
    let table = &source[start..];
    let table = &table[..table.find("\n};").expect("the table ends with `};`")];
    let number = |text: &str| text.trim().parse::<usize>().unwrap_or_else(|_| panic!("not a number: {text:?}"));
    table
        .lines()
        .skip(1)
        .map(str::trim)
        .filter(|line| !line.is_empty() && !line.starts_with("//"))
        .map(|line| {
            let inner = line.strip_prefix(".{").and_then(|l| l.strip_suffix("},")).unwrap_or_else(|| panic!("unexpected line: {line}"));
            let (head, offsets) = inner.split_once(".{").unwrap_or_else(|| panic!("no offsets in: {line}"));
            let offsets = offsets.trim().strip_suffix('}').unwrap_or_else(|| panic!("unterminated offsets in: {line}"));
            let parts: Vec<&str> = head.split(',').map(str::trim).filter(|p| !p.is_empty()).collect();
            let [zig, wit, size, align] = parts[..] else { panic!("expected a type, a WIT name, a size and an alignment in: {line}") };
            ZigLayout {
                zig: zig.to_string(),
                wit: wit.trim_matches('"').to_string(),
                layout: Layout {
                    size: number(size),
                    align: number(align),
                    offsets: offsets.split(',').map(str::trim).filter(|o| !o.is_empty()).map(number).collect(),
                },
            }
        })
        .collect()
}

#[test]
fn the_zig_example_layouts_match_the_wit() {
    let path = root().join("policy-examples/zig/abi.zig");
    let source = std::fs::read_to_string(&path).unwrap();
    // The example is built against the version its header names (`yardmaster:policy@X.Y.Z`).
    let version = source.split("yardmaster:policy@").nth(1).and_then(|rest| rest.split('`').next()).expect("abi.zig names its contract");
    let contract = Contract::load(version);
    let layouts = zig_layouts(&source);
    assert!(layouts.len() >= 20, "abi.zig's table lists its types: {layouts:?}");
    let hot = ["Request", "BatchOutcome", "RequestResult", "Event", "Action"];
    for name in hot {
        assert!(layouts.iter().any(|l| l.zig == name), "{name} is missing from abi.zig's canonical_layouts");
    }
    let mut wrong = Vec::new();
    for entry in &layouts {
        let wit = contract.layout(contract.lookup(&entry.wit));
        if wit != entry.layout {
            wrong.push(format!("{} (`{}`): abi.zig says {:?}, the WIT gives {:?}", entry.zig, entry.wit, entry.layout, wit));
        }
    }
    assert!(wrong.is_empty(), "{} disagrees with wit/{version}:\n{}", path.display(), wrong.join("\n"));
}

#[test]
fn the_zig_table_parser_reads_what_it_should() {
    let source = "pub const canonical_layouts = .{\n    // a comment\n    .{ Request, \"request\", 80, 8, .{ 0, 8 } },\n    .{ Empty, \"e\", 0, 1, .{} },\n};\n";
    let layouts = zig_layouts(source);
    assert_eq!(layouts.len(), 2);
    assert_eq!((layouts[0].zig.as_str(), layouts[0].wit.as_str()), ("Request", "request"));
    assert_eq!(layouts[0].layout, Layout { size: 80, align: 8, offsets: vec![0, 8] });
    assert_eq!(layouts[1].layout, Layout { size: 0, align: 1, offsets: vec![] });
}
