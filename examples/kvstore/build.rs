fn main() -> Result<(), topspin_build::Error> {
    topspin_build::compile_protos(&["proto/kv/v1/kv.proto"], &["proto"])
}
