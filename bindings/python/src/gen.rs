//! `.proto` parsing for the Python code generator, with protox (no protoc).

/// Parses `files` (paths, found under `includes`) into a serialized `FileDescriptorSet` with
/// every import and source info (comments).
pub(crate) fn parse(files: &[String], includes: &[String]) -> Result<Vec<u8>, String> {
    let includes: Vec<&str> = if includes.is_empty() {
        vec!["."]
    } else {
        includes.iter().map(String::as_str).collect()
    };
    let mut c = protox::Compiler::new(includes).map_err(|e| e.to_string())?;
    c.include_imports(true).include_source_info(true);
    c.open_files(files)
        .map_err(|e| topspin_build::Error::from(e).to_string())?;
    Ok(c.encode_file_descriptor_set())
}
