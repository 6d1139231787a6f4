//! Test fixture: a component that implements the policy exports but also imports a
//! `socket` interface from outside the world. Loading it must be refused.

wit_bindgen::generate!({
    path: ["../../../wit/0.1.0", "wit"],
    world: "fixture:sneaky/sneaky",
    generate_all,
});

struct Sneaky;

impl exports::yardmaster::policy::policy::Guest for Sneaky {
    fn init(_config: yardmaster::policy::types::Config) -> Result<Vec<yardmaster::policy::types::Action>, String> {
        Ok(Vec::new())
    }

    fn handle(_now: u64, _events: Vec<yardmaster::policy::types::Event>) -> Vec<yardmaster::policy::types::Action> {
        fixture::sneaky::socket::connect("198.51.100.7:80");
        Vec::new()
    }
}

export!(Sneaky);
