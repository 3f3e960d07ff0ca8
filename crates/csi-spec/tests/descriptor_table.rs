//! Our compiled `csi.proto` against a table transcribed by hand from the CSI v1.12 spec text
//! (`tests/csi_v1_12_schema.txt`): every service and method (streaming included), every
//! message with its fields' numbers, names, types, labels, oneofs and options (`csi_secret`,
//! `alpha_field`, `deprecated`), every enum value, and the alpha options of messages, enums,
//! enum values, services and methods. Any drift either way fails, naming the block.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;

use prost_reflect::{
    DescriptorPool, DynamicMessage, EnumDescriptor, ExtensionDescriptor, FieldDescriptor, Kind,
    MessageDescriptor, ServiceDescriptor, Value,
};

const TABLE: &str = include_str!("csi_v1_12_schema.txt");
const PACKAGE: &str = "csi.v1.";

/// One block of the table: its header line (`message X alpha`) and its item lines.
type Blocks = BTreeMap<String, (String, Vec<String>)>;

struct Options {
    csi_secret: ExtensionDescriptor,
    alpha_field: ExtensionDescriptor,
    alpha_message: ExtensionDescriptor,
    alpha_enum: ExtensionDescriptor,
    alpha_enum_value: ExtensionDescriptor,
    alpha_service: ExtensionDescriptor,
    alpha_method: ExtensionDescriptor,
}

impl Options {
    fn load(pool: &DescriptorPool) -> Self {
        let ext = |name: &str| {
            pool.get_extension_by_name(&format!("{PACKAGE}{name}"))
                .unwrap_or_else(|| panic!("extension {name} declared in csi.proto"))
        };
        Options {
            csi_secret: ext("csi_secret"),
            alpha_field: ext("alpha_field"),
            alpha_message: ext("alpha_message"),
            alpha_enum: ext("alpha_enum"),
            alpha_enum_value: ext("alpha_enum_value"),
            alpha_service: ext("alpha_service"),
            alpha_method: ext("alpha_method"),
        }
    }
}

/// `true` when the boolean option extension is set to true on these options.
fn flag(options: &DynamicMessage, ext: &ExtensionDescriptor) -> bool {
    options.has_extension(ext) && matches!(*options.get_extension(ext), Value::Bool(true))
}

fn deprecated(options: &DynamicMessage) -> bool {
    options
        .get_field_by_name("deprecated")
        .is_some_and(|v| matches!(*v, Value::Bool(true)))
}

fn short(full_name: &str) -> String {
    full_name
        .strip_prefix(PACKAGE)
        .unwrap_or(full_name)
        .to_string()
}

fn suffix(parts: &mut String, on: bool, word: &str) {
    if on {
        parts.push(' ');
        parts.push_str(word);
    }
}

fn type_name(field: &FieldDescriptor) -> String {
    if field.is_map() {
        let Kind::Message(entry) = field.kind() else {
            unreachable!("a map field's kind is its entry message")
        };
        let k = entry.map_entry_key_field();
        let v = entry.map_entry_value_field();
        return format!("map<{},{}>", kind_name(&k.kind()), kind_name(&v.kind()));
    }
    let base = kind_name(&field.kind());
    if field.is_list() {
        format!("repeated {base}")
    } else {
        base
    }
}

fn kind_name(kind: &Kind) -> String {
    match kind {
        Kind::Message(m) => short(m.full_name()),
        Kind::Enum(e) => short(e.full_name()),
        Kind::String => "string".into(),
        Kind::Bool => "bool".into(),
        Kind::Int32 => "int32".into(),
        Kind::Int64 => "int64".into(),
        Kind::Uint32 => "uint32".into(),
        Kind::Uint64 => "uint64".into(),
        Kind::Bytes => "bytes".into(),
        other => format!("{other:?}").to_lowercase(),
    }
}

fn message_block(m: &MessageDescriptor, o: &Options) -> (String, Vec<String>) {
    let mut header = format!("message {}", short(m.full_name()));
    let opts = m.options();
    suffix(&mut header, flag(&opts, &o.alpha_message), "alpha");
    suffix(&mut header, deprecated(&opts), "deprecated");
    let mut fields: Vec<FieldDescriptor> = m.fields().collect();
    fields.sort_by_key(|f| f.number());
    let items = fields
        .iter()
        .map(|f| {
            let mut line = format!("{} {} {}", f.number(), f.name(), type_name(f));
            if let Some(oneof) = f.containing_oneof().filter(|o| !o.is_synthetic()) {
                line.push_str(&format!(" oneof={}", oneof.name()));
            }
            let fo = f.options();
            suffix(&mut line, flag(&fo, &o.csi_secret), "secret");
            suffix(&mut line, flag(&fo, &o.alpha_field), "alpha");
            suffix(&mut line, deprecated(&fo), "deprecated");
            line
        })
        .collect();
    (header, items)
}

fn enum_block(e: &EnumDescriptor, o: &Options) -> (String, Vec<String>) {
    let mut header = format!("enum {}", short(e.full_name()));
    let opts = e.options();
    suffix(&mut header, flag(&opts, &o.alpha_enum), "alpha");
    suffix(&mut header, deprecated(&opts), "deprecated");
    let mut values: Vec<_> = e.values().collect();
    values.sort_by_key(|v| v.number());
    let items = values
        .iter()
        .map(|v| {
            let mut line = format!("{} {}", v.number(), v.name());
            let vo = v.options();
            suffix(&mut line, flag(&vo, &o.alpha_enum_value), "alpha");
            suffix(&mut line, deprecated(&vo), "deprecated");
            line
        })
        .collect();
    (header, items)
}

fn service_block(s: &ServiceDescriptor, o: &Options) -> (String, Vec<String>) {
    let mut header = format!("service {}", s.name());
    let opts = s.options();
    suffix(&mut header, flag(&opts, &o.alpha_service), "alpha");
    suffix(&mut header, deprecated(&opts), "deprecated");
    let items = s
        .methods()
        .map(|m| {
            assert!(!m.is_client_streaming(), "no CSI RPC streams its request");
            let mut line = format!(
                "{} {} -> {}{}",
                m.name(),
                short(m.input().full_name()),
                if m.is_server_streaming() {
                    "stream "
                } else {
                    ""
                },
                short(m.output().full_name()),
            );
            let mo = m.options();
            suffix(&mut line, flag(&mo, &o.alpha_method), "alpha");
            suffix(&mut line, deprecated(&mo), "deprecated");
            line
        })
        .collect();
    (header, items)
}

/// The compiled descriptor pool, rendered in the table's form.
fn compiled() -> Blocks {
    let pool = DescriptorPool::decode(csi_spec::FILE_DESCRIPTOR_SET).expect("descriptor set");
    let o = Options::load(&pool);
    let file = pool
        .files()
        .find(|f| f.name() == "csi.proto")
        .expect("csi.proto in the descriptor set");
    let mut blocks = Blocks::new();
    let mut add = |(header, items): (String, Vec<String>)| {
        let key = key_of(&header);
        assert!(
            blocks.insert(key.clone(), (header, items)).is_none(),
            "{key} twice"
        );
    };
    for s in file.services() {
        add(service_block(&s, &o));
    }
    for m in pool.all_messages() {
        if m.parent_file().name() == "csi.proto" && !m.is_map_entry() {
            add(message_block(&m, &o));
        }
    }
    for e in pool.all_enums() {
        if e.parent_file().name() == "csi.proto" {
            add(enum_block(&e, &o));
        }
    }
    blocks
}

/// `message Foo alpha` -> `message Foo`: blocks are matched by kind and name, so a differing
/// option shows up as a differing header, not as a missing block.
fn key_of(header: &str) -> String {
    header
        .split_whitespace()
        .take(2)
        .collect::<Vec<_>>()
        .join(" ")
}

/// The hand-written table, with comments and blank lines dropped and message/enum items
/// ordered by number (as [`compiled`] orders them); methods keep the spec's order.
fn table() -> Blocks {
    let mut blocks = Blocks::new();
    let mut current: Option<(String, Vec<String>)> = None;
    let finish = |block: Option<(String, Vec<String>)>, blocks: &mut Blocks| {
        if let Some((header, mut items)) = block {
            if !header.starts_with("service ") {
                items.sort_by_key(|i| {
                    i.split_whitespace()
                        .next()
                        .and_then(|n| n.parse::<i64>().ok())
                        .unwrap_or_else(|| panic!("{header}: item without a number: {i}"))
                });
            }
            let key = key_of(&header);
            assert!(
                blocks.insert(key.clone(), (header, items)).is_none(),
                "table lists {key} twice"
            );
        }
    };
    for line in TABLE.lines() {
        if line.trim().is_empty() || line.trim_start().starts_with('#') {
            continue;
        }
        if let Some(item) = line.strip_prefix("  ") {
            let (_, items) = current
                .as_mut()
                .unwrap_or_else(|| panic!("item outside a block: {line}"));
            items.push(item.split_whitespace().collect::<Vec<_>>().join(" "));
        } else {
            finish(current.take(), &mut blocks);
            current = Some((
                line.split_whitespace().collect::<Vec<_>>().join(" "),
                vec![],
            ));
        }
    }
    finish(current.take(), &mut blocks);
    blocks
}

#[test]
fn compiled_schema_matches_the_spec_table() {
    let want = table();
    let got = compiled();
    let mut problems = Vec::new();
    for (key, (header, items)) in &want {
        match got.get(key) {
            None => problems.push(format!("missing from csi.proto: {header}")),
            Some((got_header, got_items)) => {
                if got_header != header {
                    problems.push(format!("{key}: spec `{header}`, ours `{got_header}`"));
                }
                for i in items.iter().filter(|i| !got_items.contains(i)) {
                    problems.push(format!("{key}: spec has `{i}`, ours does not"));
                }
                for i in got_items.iter().filter(|i| !items.contains(i)) {
                    problems.push(format!("{key}: ours has `{i}`, spec does not"));
                }
                if problems.is_empty() && got_items != items {
                    problems.push(format!("{key}: order differs: {got_items:?} vs {items:?}"));
                }
            }
        }
    }
    for (key, (header, _)) in &got {
        if !want.contains_key(key) {
            problems.push(format!("not in the spec: {header}"));
        }
    }
    assert!(
        problems.is_empty(),
        "csi.proto drifts from the CSI v1.12 table:\n  {}",
        problems.join("\n  ")
    );
}

/// The table itself is sane: it covers the five services and every kind of option, so a
/// parser slip that drops blocks or options cannot make the comparison vacuous.
#[test]
fn table_covers_every_service_and_option_kind() {
    let t = table();
    let services: Vec<&str> = t
        .keys()
        .filter_map(|k| k.strip_prefix("service "))
        .collect();
    assert_eq!(
        services,
        vec![
            "Controller",
            "GroupController",
            "Identity",
            "Node",
            "SnapshotMetadata"
        ]
    );
    let methods: usize = t
        .iter()
        .filter(|(k, _)| k.starts_with("service "))
        .map(|(_, (_, items))| items.len())
        .sum();
    assert_eq!(methods, 3 + 15 + 4 + 2 + 8);
    let all: Vec<&String> = t.values().flat_map(|(_, items)| items).collect();
    let secrets = all.iter().filter(|i| i.contains(" secret")).count();
    assert_eq!(
        secrets, 19,
        "one csi_secret map per request that carries secrets"
    );
    assert!(all.iter().any(|i| i.ends_with("secret alpha")));
    assert!(
        t.values()
            .any(|(h, _)| h.starts_with("message ") && h.ends_with(" alpha"))
    );
    assert!(
        t.values()
            .any(|(h, _)| h.starts_with("service ") && h.ends_with(" alpha"))
    );
    assert!(all.iter().any(|i| i.contains(" -> stream ")));
    assert!(all.iter().any(|i| i.contains(" oneof=")));
}
