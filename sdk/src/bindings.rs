//! Generated bindings of the `yardmaster:policy@0.3.0` world (the latest).
//!
//! The record and variant types generated here are the SDK's vocabulary (re-exported
//! from the crate root), so a policy's code compiles the same for `wasm32-wasip2` and
//! natively. The imports only exist inside a component; [`crate::Host`] wraps them.

wit_bindgen::generate!({
    path: "../wit/0.3.0",
    world: "yardmaster:policy/scheduler@0.3.0",
    pub_export_macro: true,
    export_macro_name: "export_scheduler",
    default_bindings_module: "yardmaster_sdk::bindings",
    additional_derives: [PartialEq],
});
