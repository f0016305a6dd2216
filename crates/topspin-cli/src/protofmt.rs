//! Prints descriptors back as `.proto` text, with their comments when the descriptors carry
//! source info.

use prost_reflect::{
    Cardinality, EnumDescriptor, FieldDescriptor, FileDescriptor, Kind, MessageDescriptor,
    MethodDescriptor, ServiceDescriptor, Syntax,
};
use std::fmt::Write;

/// The leading comment of the element at `path` in `file`, as `//` lines.
fn comments(file: &FileDescriptor, path: &[i32], indent: &str, out: &mut String) {
    let Some(info) = &file.file_descriptor_proto().source_code_info else {
        return;
    };
    let Some(loc) = info.location.iter().find(|l| l.path == path) else {
        return;
    };
    if let Some(c) = &loc.leading_comments {
        for line in c.trim_end_matches('\n').lines() {
            let _ = writeln!(out, "{indent}//{line}");
        }
    }
}

fn trailing(file: &FileDescriptor, path: &[i32]) -> String {
    file.file_descriptor_proto()
        .source_code_info
        .as_ref()
        .and_then(|i| i.location.iter().find(|l| l.path == path))
        .and_then(|l| l.trailing_comments.as_deref())
        .map(|c| format!(" //{}", c.trim_end().replace('\n', " ")))
        .unwrap_or_default()
}

fn type_name(field: &FieldDescriptor) -> String {
    match field.kind() {
        Kind::Double => "double".into(),
        Kind::Float => "float".into(),
        Kind::Int32 => "int32".into(),
        Kind::Int64 => "int64".into(),
        Kind::Uint32 => "uint32".into(),
        Kind::Uint64 => "uint64".into(),
        Kind::Sint32 => "sint32".into(),
        Kind::Sint64 => "sint64".into(),
        Kind::Fixed32 => "fixed32".into(),
        Kind::Fixed64 => "fixed64".into(),
        Kind::Sfixed32 => "sfixed32".into(),
        Kind::Sfixed64 => "sfixed64".into(),
        Kind::Bool => "bool".into(),
        Kind::String => "string".into(),
        Kind::Bytes => "bytes".into(),
        Kind::Message(m) => m.full_name().into(),
        Kind::Enum(e) => e.full_name().into(),
    }
}

fn field_line(field: &FieldDescriptor, proto2: bool) -> String {
    let ty = if field.is_map() {
        let Kind::Message(entry) = field.kind() else {
            unreachable!("map fields are messages")
        };
        format!(
            "map<{}, {}>",
            type_name(&entry.map_entry_key_field()),
            type_name(&entry.map_entry_value_field())
        )
    } else {
        let label = match field.cardinality() {
            Cardinality::Repeated => "repeated ",
            Cardinality::Required => "required ",
            Cardinality::Optional
                if proto2 || field.containing_oneof().is_some_and(|o| o.is_synthetic()) =>
            {
                "optional "
            }
            Cardinality::Optional => "",
        };
        format!("{label}{}", type_name(field))
    };
    let proto = field.field_descriptor_proto();
    let mut options = Vec::new();
    if let Some(d) = &proto.default_value {
        if matches!(field.kind(), Kind::String | Kind::Bytes) {
            options.push(format!("default = {d:?}"));
        } else {
            options.push(format!("default = {d}"));
        }
    }
    if let Some(packed) = proto.options.as_ref().and_then(|o| o.packed) {
        options.push(format!("packed = {packed}"));
    }
    let options = if options.is_empty() {
        String::new()
    } else {
        format!(" [{}]", options.join(", "))
    };
    format!("{ty} {} = {}{options};", field.name(), field.number())
}

/// A message, with its nested messages and enums.
pub(crate) fn message(m: &MessageDescriptor, indent: &str, out: &mut String) {
    let file = m.parent_file();
    let proto2 = file.syntax() == Syntax::Proto2;
    comments(&file, m.path(), indent, out);
    let _ = writeln!(out, "{indent}message {} {{", m.name());
    let inner = format!("{indent}  ");
    let mut oneofs_done = Vec::new();
    for field in m.fields() {
        match field.containing_oneof().filter(|o| !o.is_synthetic()) {
            Some(oneof) => {
                if oneofs_done.contains(&oneof.name().to_owned()) {
                    continue;
                }
                oneofs_done.push(oneof.name().to_owned());
                comments(&file, oneof.path(), &inner, out);
                let _ = writeln!(out, "{inner}oneof {} {{", oneof.name());
                let deeper = format!("{inner}  ");
                for f in oneof.fields() {
                    comments(&file, f.path(), &deeper, out);
                    let _ = writeln!(
                        out,
                        "{deeper}{}{}",
                        field_line(&f, false),
                        trailing(&file, f.path())
                    );
                }
                let _ = writeln!(out, "{inner}}}");
            }
            None => {
                comments(&file, field.path(), &inner, out);
                let _ = writeln!(
                    out,
                    "{inner}{}{}",
                    field_line(&field, proto2),
                    trailing(&file, field.path())
                );
            }
        }
    }
    for child in m.child_messages().filter(|c| !c.is_map_entry()) {
        out.push('\n');
        message(&child, &inner, out);
    }
    for e in m.child_enums() {
        out.push('\n');
        enumeration(&e, &inner, out);
    }
    let _ = writeln!(out, "{indent}}}");
}

/// An enum.
pub(crate) fn enumeration(e: &EnumDescriptor, indent: &str, out: &mut String) {
    let file = e.parent_file();
    comments(&file, e.path(), indent, out);
    let _ = writeln!(out, "{indent}enum {} {{", e.name());
    for v in e.values() {
        comments(&file, v.path(), &format!("{indent}  "), out);
        let _ = writeln!(
            out,
            "{indent}  {} = {};{}",
            v.name(),
            v.number(),
            trailing(&file, v.path())
        );
    }
    let _ = writeln!(out, "{indent}}}");
}

/// The `rpc` line of a method.
pub(crate) fn rpc_line(m: &MethodDescriptor) -> String {
    format!(
        "rpc {}({}{}) returns ({}{});",
        m.name(),
        if m.is_client_streaming() {
            "stream "
        } else {
            ""
        },
        m.input().full_name(),
        if m.is_server_streaming() {
            "stream "
        } else {
            ""
        },
        m.output().full_name()
    )
}

/// A method, with its comments.
pub(crate) fn method(m: &MethodDescriptor, indent: &str, out: &mut String) {
    let file = m.parent_file();
    comments(&file, m.path(), indent, out);
    let _ = writeln!(out, "{indent}{}{}", rpc_line(m), trailing(&file, m.path()));
}

/// A service and its methods.
pub(crate) fn service(s: &ServiceDescriptor, out: &mut String) {
    let file = s.parent_file();
    comments(&file, s.path(), "", out);
    let _ = writeln!(out, "service {} {{", s.name());
    for m in s.methods() {
        method(&m, "  ", out);
    }
    let _ = writeln!(out, "}}");
}
