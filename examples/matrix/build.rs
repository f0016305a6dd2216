fn main() -> Result<(), topspin_build::Error> {
    topspin_build::compile_protos(
        &["../../testdata/matrix/matrix.proto"],
        &["../../testdata/matrix"],
    )
}
