//! napi-build sets the linker flags of a Node addon.
fn main() {
    napi_build::setup();
}
