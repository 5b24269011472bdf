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

pub(super) const TOP_KEYS: &[&str] = &[
    "driver_version",
    "state_dir",
    "log",
    "device",
    "cost",
    "faults",
];
pub(super) const DEVICE_KEYS: &[&str] = &[
    "name",
    "memory",
    "sms",
    "compute_capability",
    "uuid",
    "pci_domain",
    "pci_bus",
    "pci_device",
];
pub(super) const COST_KEYS: &[&str] = &[
    "kernel_base",
    "wave",
    "pcie_bandwidth",
    "hbm_bandwidth",
    "copy_base",
    "fault",
    "fault_bandwidth",
    "timeslice",
    "ctx_switch",
    "kernels",
];
pub(super) const FAULT_KEYS: &[&str] = &["fail_alloc_nth", "launch_error", "stall_stream_after"];

/// Applies a parsed TOML file; errors name `path:key`.
pub(super) struct TomlFile<'a> {
    path: &'a str,
}

impl TomlFile<'_> {
    fn apply(&self, cfg: &mut SimConfig, root: &Node) -> Result<(), ConfigError> {
        let Node::Table(entries) = root else {
            return Err(invalid(self.path, &root.shown(), "expected a TOML table"));
        };
        for (key, node) in entries {
            match key.as_str() {
                "driver_version" => cfg.driver_version = self.value(key, node, &DRIVER_VERSION)?,
                "state_dir" => cfg.state_dir = self.value(key, node, &STATE_DIR)?,
                "log" => cfg.log_level = self.value(key, node, &LOG)?,
                "device" => cfg.devices = self.devices(node)?,
                "cost" => self.cost(&mut cfg.cost, node)?,
                "faults" => self.faults(&mut cfg.faults, node)?,
                _ => return Err(self.unknown(key, TOP_KEYS)),
            }
        }
        Ok(())
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
                match key.as_str() {
                    "name" => device.name = self.value(key_path, node, &DEVICE_NAME)?,
                    "memory" => device.memory = self.value(key_path, node, &MEMORY)?,
                    "sms" => device.sm_count = self.value(key_path, node, &SMS)?,
                    "compute_capability" => {
                        device.compute_capability =
                            self.value(key_path, node, &COMPUTE_CAPABILITY)?
                    }
                    "uuid" => {
                        device.uuid = self.value(key_path, node, &UUID)?;
                        if let Some(other) = devices.iter().position(|d| d.uuid == device.uuid) {
                            let expected =
                                format!("expected a UUID different from device[{other}]'s");
                            return Err(self.invalid(key_path, node, &expected));
                        }
                    }
                    "pci_domain" => device.pci_domain = self.value(key_path, node, &PCI_DOMAIN)?,
                    "pci_bus" => device.pci_bus = self.value(key_path, node, &PCI_BUS)?,
                    "pci_device" => device.pci_device = self.value(key_path, node, &PCI_DEVICE)?,
                    _ => return Err(self.unknown(key_path, DEVICE_KEYS)),
                }
            }
            devices.push(device);
        }
        Ok(devices)
    }

    fn cost(&self, cost: &mut CostModel, node: &Node) -> Result<(), ConfigError> {
        for (key, node) in self.table("cost", node)? {
            let key_path = format!("cost.{key}");
            let key_path = key_path.as_str();
            match key.as_str() {
                "kernel_base" => cost.kernel_base_ns = self.value(key_path, node, &DURATION)?,
                "wave" => cost.wave_ns = self.value(key_path, node, &DURATION)?,
                "pcie_bandwidth" => {
                    cost.pcie_bytes_per_s = self.value(key_path, node, &BANDWIDTH)?
                }
                "hbm_bandwidth" => cost.hbm_bytes_per_s = self.value(key_path, node, &BANDWIDTH)?,
                "copy_base" => cost.copy_base_ns = self.value(key_path, node, &DURATION)?,
                "fault" => cost.fault_ns = self.value(key_path, node, &DURATION)?,
                "fault_bandwidth" => {
                    cost.fault_bytes_per_s = self.value(key_path, node, &BANDWIDTH)?
                }
                "timeslice" => cost.timeslice_ns = self.value(key_path, node, &DURATION)?,
                "ctx_switch" => cost.ctx_switch_ns = self.value(key_path, node, &DURATION)?,
                "kernels" => {
                    let mut times = Vec::new();
                    for (name, node) in self.table(key_path, node)? {
                        let name_path = format!("cost.kernels.{name:?}");
                        if name.is_empty() {
                            return Err(self.invalid(
                                &name_path,
                                node,
                                "expected a non-empty kernel name",
                            ));
                        }
                        times.push((name.clone(), self.value(&name_path, node, &DURATION)?));
                    }
                    add_kernel_overrides(&mut cost.kernel_overrides, times);
                }
                _ => return Err(self.unknown(key_path, COST_KEYS)),
            }
        }
        Ok(())
    }

    fn faults(&self, faults: &mut Faults, node: &Node) -> Result<(), ConfigError> {
        for (key, node) in self.table("faults", node)? {
            let key_path = format!("faults.{key}");
            let key_path = key_path.as_str();
            match key.as_str() {
                "fail_alloc_nth" => {
                    faults.fail_alloc_nth = Some(self.value(key_path, node, &FAIL_ALLOC_NTH)?)
                }
                "launch_error" => {
                    faults.launch_error = Some(self.value(key_path, node, &LAUNCH_ERROR)?)
                }
                "stall_stream_after" => {
                    faults.stall_stream_after =
                        Some(self.value(key_path, node, &STALL_STREAM_AFTER)?)
                }
                _ => return Err(self.unknown(key_path, FAULT_KEYS)),
            }
        }
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
