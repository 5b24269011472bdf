//! The TOML file (`SIMGPU_CONFIG`): keys in document order, errors that name `file:key`.

use super::*;

/// A TOML value that keeps table keys in document order (`toml::Table` sorts them, and the
/// order of `[cost.kernels]` decides which substring override matches first).
#[derive(Debug)]
pub(super) enum Node {
    Text(String),
    /// An integer or float, as text.
    Number(String),
    /// A boolean or date-time, by kind: no setting accepts one.
    Other(&'static str),
    Array(Vec<Node>),
    Table(Vec<(String, Node)>),
}

impl Node {
    /// The value as text, for the settings' parsers (strings and numbers only).
    fn scalar(&self) -> Option<&str> {
        match self {
            Node::Text(s) | Node::Number(s) => Some(s),
            _ => None,
        }
    }

    /// How an error message shows the value.
    fn shown(&self) -> String {
        match self {
            Node::Text(s) => format!("{s:?}"),
            Node::Number(s) => s.clone(),
            Node::Other(kind) => (*kind).to_owned(),
            Node::Array(_) => "an array".to_owned(),
            Node::Table(_) => "a table".to_owned(),
        }
    }
}

impl<'de> serde::Deserialize<'de> for Node {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Node, D::Error> {
        deserializer.deserialize_any(NodeVisitor)
    }
}

pub(super) struct NodeVisitor;

impl<'de> serde::de::Visitor<'de> for NodeVisitor {
    type Value = Node;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a TOML value")
    }

    fn visit_bool<E>(self, _: bool) -> Result<Node, E> {
        Ok(Node::Other("a boolean"))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Node, E> {
        Ok(Node::Number(v.to_string()))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Node, E> {
        Ok(Node::Number(v.to_string()))
    }

    fn visit_f64<E>(self, v: f64) -> Result<Node, E> {
        Ok(Node::Number(v.to_string()))
    }

    fn visit_str<E>(self, v: &str) -> Result<Node, E> {
        Ok(Node::Text(v.to_owned()))
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Node, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element()? {
            items.push(item);
        }
        Ok(Node::Array(items))
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Node, A::Error> {
        let mut entries: Vec<(String, Node)> = Vec::new();
        while let Some(entry) = map.next_entry()? {
            entries.push(entry);
        }
        // toml hands a date-time over as a one-entry map with this private key.
        if entries.len() == 1 && entries[0].0 == "$__toml_private_datetime" {
            return Ok(Node::Other("a date-time"));
        }
        Ok(Node::Table(entries))
    }
}

pub(super) fn load_file(cfg: &mut SimConfig, path: &str) -> Result<(), ConfigError> {
    let shown = format!("{path:?}");
    let text = std::fs::read_to_string(Path::new(path)).map_err(|e| {
        invalid(
            "SIMGPU_CONFIG",
            &shown,
            &format!("cannot read the file: {e}"),
        )
    })?;
    let root: Node = toml::from_str(&text).map_err(|e| {
        let at = match e.span() {
            Some(span) => {
                let (line, column) = line_column(&text, span.start);
                format!(" at line {line}, column {column}")
            }
            None => String::new(),
        };
        let message: Vec<&str> = e.message().lines().map(str::trim).collect();
        let expected = format!("TOML error{at}: {}", message.join("; "));
        invalid("SIMGPU_CONFIG", &shown, &expected)
    })?;
    TomlFile { path }.apply(cfg, &root)
}

/// 1-based line and column (in characters) of byte `offset` in `text`.
pub(super) fn line_column(text: &str, offset: usize) -> (usize, usize) {
    let before = text.get(..offset).unwrap_or(text);
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    (
        before.matches('\n').count() + 1,
        before[line_start..].chars().count() + 1,
    )
}

/// The tables of the file's top level (besides the machine rows' plain keys).
const TABLES: &[&str] = &["device", "cost", "faults"];
/// The one key of `[cost]` that is a table of its own.
const KERNELS_KEY: &str = "kernels";

/// The keys a table of the file knows ("" for the top level), in the rows' order.
pub(super) fn known_keys(table: &str) -> Vec<&'static str> {
    if table == "device" {
        return DEVICE_ROWS.iter().map(|r| r.1).collect();
    }
    let mut keys: Vec<&'static str> = MACHINE_ROWS
        .iter()
        .filter_map(|r| r.1)
        .filter_map(|k| match k.split_once('.') {
            Some((t, key)) => (t == table).then_some(key),
            None => table.is_empty().then_some(k),
        })
        .collect();
    match table {
        "" => keys.extend(TABLES),
        "cost" => keys.push(KERNELS_KEY),
        _ => {}
    }
    keys
}

/// Applies a parsed TOML file; errors name `path:key`.
pub(super) struct TomlFile<'a> {
    pub(super) path: &'a str,
}

impl TomlFile<'_> {
    pub(super) fn apply(&self, cfg: &mut SimConfig, root: &Node) -> Result<(), ConfigError> {
        let Node::Table(entries) = root else {
            return Err(invalid(self.path, &root.shown(), "expected a TOML table"));
        };
        for (key, node) in entries {
            match key.as_str() {
                "device" => cfg.devices = self.devices(node)?,
                "cost" | "faults" => {
                    for (k, n) in self.table(key, node)? {
                        if key == "cost" && k == KERNELS_KEY {
                            self.kernels(cfg, n)?;
                        } else {
                            self.setting(cfg, key, &format!("{key}.{k}"), n)?;
                        }
                    }
                }
                _ => self.setting(cfg, "", key, node)?,
            }
        }
        Ok(())
    }

    /// The machine row of `key_path` (in `table`) takes `node`'s value.
    fn setting(
        &self,
        cfg: &mut SimConfig,
        table: &str,
        key_path: &str,
        node: &Node,
    ) -> Result<(), ConfigError> {
        let Some((_, _, set)) = MACHINE_ROWS.iter().find(|r| r.1 == Some(key_path)) else {
            return Err(self.unknown(key_path, &known_keys(table)));
        };
        set(cfg, node.scalar().map(str::trim)).map_err(|e| self.invalid(key_path, node, e))
    }

    fn devices(&self, node: &Node) -> Result<Vec<DeviceConfig>, ConfigError> {
        const EXPECTED: &str = "expected 1 to 16 [[device]] tables";
        let Node::Array(items) = node else {
            return Err(self.invalid("device", node, EXPECTED));
        };
        if items.is_empty() || items.len() > MAX_DEVICES {
            return Err(self.invalid("device", node, EXPECTED));
        }
        let mut devices: Vec<DeviceConfig> = Vec::new();
        for (index, item) in items.iter().enumerate() {
            let path = format!("device[{index}]");
            let entries = self.table(&path, item)?;
            let mut device = DeviceConfig::a100(index as u32);
            for (key, node) in entries {
                let key_path = format!("{path}.{key}");
                let key_path = key_path.as_str();
                let Some((_, _, set)) = DEVICE_ROWS.iter().find(|r| r.1 == key) else {
                    return Err(self.unknown(key_path, &known_keys("device")));
                };
                set(&mut device, node.scalar().map(str::trim))
                    .map_err(|e| self.invalid(key_path, node, e))?;
                if key == "uuid" {
                    if let Some(other) = devices.iter().position(|d| d.uuid == device.uuid) {
                        let expected = format!("expected a UUID different from device[{other}]'s");
                        return Err(self.invalid(key_path, node, &expected));
                    }
                }
            }
            devices.push(device);
        }
        Ok(devices)
    }

    /// `[cost.kernels]`: kernel name = duration, in the file's order.
    fn kernels(&self, cfg: &mut SimConfig, node: &Node) -> Result<(), ConfigError> {
        let mut times = Vec::new();
        for (name, node) in self.table("cost.kernels", node)? {
            let name_path = format!("cost.kernels.{name:?}");
            if name.is_empty() {
                return Err(self.invalid(&name_path, node, "expected a non-empty kernel name"));
            }
            times.push((name.clone(), self.value(&name_path, node, &DURATION)?));
        }
        add_kernel_overrides(&mut cfg.cost.kernel_overrides, times);
        Ok(())
    }

    /// The entries of a table at `key_path`, or an error if the node is not a table.
    fn table<'n>(
        &self,
        key_path: &str,
        node: &'n Node,
    ) -> Result<&'n [(String, Node)], ConfigError> {
        match node {
            Node::Table(entries) => Ok(entries),
            _ => Err(self.invalid(key_path, node, &format!("expected a table ([{key_path}])"))),
        }
    }

    fn value<T>(
        &self,
        key_path: &str,
        node: &Node,
        setting: &Setting<T>,
    ) -> Result<T, ConfigError> {
        node.scalar()
            .map(|s| s.trim())
            .and_then(setting.parse)
            .ok_or_else(|| self.invalid(key_path, node, setting.expected))
    }

    fn invalid(&self, key_path: &str, node: &Node, expected: &str) -> ConfigError {
        invalid(
            &format!("{}:{key_path}", self.path),
            &node.shown(),
            expected,
        )
    }

    fn unknown(&self, key_path: &str, known: &[&str]) -> ConfigError {
        ConfigError(format!(
            "simgpu: unknown key {}:{key_path}; known: {}",
            self.path,
            known.join(", ")
        ))
    }
}
