//! A PTX module rewritten into its *slice module*: every kernel that can run one block range of
//! its grid as a sliced entry, nothing else changed.
//!
//! For `.entry K(params) { body }` the slice module holds
//! `.entry K__ls_slice(params, .param .u32 __ls_ox, __ls_oy, __ls_oz, __ls_nx, __ls_ny, __ls_nz)`
//! whose body reads `%ctaid.{x,y,z}` as its own block index plus the range's offset
//! (`__ls_o*`) and `%nctaid.{x,y,z}` as the whole grid (`__ls_n*`); everything else in the body
//! is the original text. The module keeps every other top-level statement (version, target,
//! functions, variables, debug sections) as written, and drops the original entries (the
//! program's own module still has them) unless a kept body names one (a device-side launch).
//!
//! The slice module is a *second* module beside the program's: its module-scope `.global` and
//! `.const` variables, textures and surfaces are copies the program never wrote (no
//! `cudaMemcpyToSymbol` reaches them), so a kernel that names one, directly or through a function
//! it calls, is refused (except the compiler's own constants: string literals and math tables). Also refused: a kernel that reads cluster registers or has cluster
//! directives, reads `%gridid` (each range is its own grid) or the vector `%ctaid`/`%nctaid`, calls
//! a function that reads the block index (functions are not rewritten) or a function this module
//! does not define (other than the driver's `vprintf`, `malloc`, `free` and `__assertfail`), or
//! whose parameters leave no room for 24 more bytes. Refused kernels run whole.
//!
//! The scanner reads the module's statements, not its instructions: it follows braces, skips
//! comments and strings, and looks at identifiers. Text it cannot follow (an unbalanced brace or
//! parenthesis, an entry without a name) is a [`PtxError`] for the whole module: nothing of it is
//! sliced.

use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;
use std::ops::Range;

/// Appended to a kernel's name to name its sliced entry.
pub const SLICE_SUFFIX: &str = "__ls_slice";
/// The parameters appended to a sliced entry, in order, each a `.u32`: the range's first block
/// (x, y, z), then the whole grid (x, y, z).
pub const SLICE_PARAMS: [&str; 6] = [
    "__ls_ox", "__ls_oy", "__ls_oz", "__ls_nx", "__ls_ny", "__ls_nz",
];
/// Bytes of the appended parameters.
pub const SLICE_PARAM_BYTES: u32 = 24;
/// A kernel's parameter space on every architecture (sm_90 with CUDA 12.1 allows 32764 bytes to
/// kernels declared with more than this; those keep that bound).
const PARAM_SPACE: u32 = 4096;
const PARAM_SPACE_LARGE: u32 = 32764;
/// Functions the driver provides to every module (the device runtime's `printf`, heap and assert).
const DRIVER_FUNCTIONS: [&str; 4] = ["vprintf", "malloc", "free", "__assertfail"];
/// Module variables the compiler makes, which a program cannot name and so never writes: string
/// literals (`$str`, `$str$1`) and the CUDA headers' math tables (`__cudart_i2opi_f`). Their copy
/// in a slice module holds the same bytes.
const COMPILER_CONSTANTS: [&str; 2] = ["$", "__cudart_"];
const CLUSTER_REGISTERS: [&str; 7] = [
    "%clusterid",
    "%nclusterid",
    "%cluster_ctaid",
    "%cluster_nctaid",
    "%cluster_ctarank",
    "%cluster_nctarank",
    "%is_explicit_cluster",
];
const CLUSTER_DIRECTIVES: [&str; 3] = ["explicitcluster", "reqnctapercluster", "maxclusterrank"];

/// A module that could not be read: nothing of it is sliced.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PtxError {
    #[error("not PTX text (no .version directive)")]
    NotPtx,
    #[error("unbalanced {what} from byte {at}")]
    Unbalanced { what: &'static str, at: usize },
    #[error("an .entry without a name at byte {0}")]
    Unnamed(usize),
    #[error("the module already uses the reserved prefix __ls_ (at byte {0})")]
    Reserved(usize),
}

/// Why a kernel runs whole.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("uses thread-block clusters")]
    Cluster,
    #[error("reads %gridid")]
    GridId,
    #[error("reads %ctaid or %nctaid as a vector")]
    VectorIndex,
    #[error("calls {0}, which reads the block index")]
    CalleeReadsIndex(String),
    #[error("names the module variable {0} (a slice module has its own copy)")]
    ModuleVariable(String),
    #[error("calls {0}, which this module does not define")]
    UnknownCallee(String),
    #[error("its parameter list could not be read")]
    Params,
    #[error("its {0} bytes of parameters leave no room for the slice's 24")]
    ParamSpace(u32),
}

/// What became of one kernel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The slice module has `entry`, whose parameters are the kernel's `params` then the six
    /// [`SLICE_PARAMS`] (a launch's `kernelParams` gets six more pointers), which start at byte
    /// `params_at` of its parameter buffer (what a launch through `extra` needs).
    Sliced {
        entry: String,
        params: usize,
        params_at: u32,
    },
    Whole(Refusal),
}

/// One `.entry` of the module.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Kernel {
    pub name: String,
    pub outcome: Outcome,
}

/// The slice module and what became of each kernel, in the module's order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rewritten {
    pub ptx: String,
    pub kernels: Vec<Kernel>,
}

impl Rewritten {
    pub fn sliced(&self) -> usize {
        self.kernels
            .iter()
            .filter(|k| matches!(k.outcome, Outcome::Sliced { .. }))
            .count()
    }
}

/// The slice module of `ptx` (see the module's doc).
pub fn rewrite(ptx: &str) -> Result<Rewritten, PtxError> {
    if let Some(at) = ptx.find("__ls_") {
        return Err(PtxError::Reserved(at));
    }
    let items = items(ptx)?;
    if !items
        .iter()
        .any(|i| matches!(i.kind, ItemKind::Other { version: true }))
    {
        return Err(PtxError::NotPtx);
    }
    let mut funcs: HashMap<&str, Option<Use>> = HashMap::new();
    let mut variables: HashSet<&str> = HashSet::new();
    let mut entry_names: HashSet<&str> = HashSet::new();
    for item in &items {
        match &item.kind {
            ItemKind::Function(f) if f.entry => {
                entry_names.insert(&ptx[f.name.clone()]);
            }
            ItemKind::Function(f) => {
                funcs.entry(&ptx[f.name.clone()]).or_insert(None);
            }
            ItemKind::Variables(names) => variables.extend(
                names
                    .iter()
                    .map(|r| &ptx[r.clone()])
                    .filter(|n| !COMPILER_CONSTANTS.iter().any(|p| n.starts_with(p))),
            ),
            ItemKind::Other { .. } => {}
        }
    }
    let known = Known {
        funcs: funcs.keys().copied().collect(),
        variables,
        entries: entry_names,
    };
    for item in &items {
        if let ItemKind::Function(f) = &item.kind {
            if !f.entry {
                if let Some(body) = &f.body {
                    funcs.insert(&ptx[f.name.clone()], Some(uses(ptx, body.clone(), &known)));
                }
            }
        }
    }
    let taints = taints(&funcs);

    let mut kept_entries: HashSet<&str> = HashSet::new();
    let mut bodies: Vec<Use> = Vec::new();
    for item in &items {
        if let ItemKind::Function(f) = &item.kind {
            if let (true, Some(body)) = (f.entry, &f.body) {
                bodies.push(uses(ptx, body.clone(), &known));
            }
        }
    }
    for (_, u) in funcs.iter().filter_map(|(n, u)| u.as_ref().map(|u| (n, u))) {
        kept_entries.extend(u.entries.iter().copied());
    }
    for u in &bodies {
        kept_entries.extend(u.entries.iter().copied());
    }

    let mut out = String::with_capacity(ptx.len() + ptx.len() / 8);
    let mut kernels = Vec::new();
    let mut bodies = bodies.into_iter();
    let mut at = 0;
    for item in &items {
        let ItemKind::Function(f) = &item.kind else {
            continue;
        };
        let (true, Some(body)) = (f.entry, &f.body) else {
            continue;
        };
        let u = bodies.next().expect("one use per entry body");
        let name = &ptx[f.name.clone()];
        out.push_str(&ptx[at..item.span.start]);
        at = item.span.end;
        if kept_entries.contains(name) {
            out.push_str(&ptx[item.span.clone()]);
        }
        let outcome = match refusal(ptx, f, &u, &taints) {
            Err(why) => Outcome::Whole(why),
            Ok((params, params_at)) => {
                out.push('\n');
                sliced_entry(&mut out, ptx, item.span.start, f, body.clone(), &u);
                Outcome::Sliced {
                    entry: format!("{name}{SLICE_SUFFIX}"),
                    params,
                    params_at,
                }
            }
        };
        kernels.push(Kernel {
            name: name.to_owned(),
            outcome,
        });
    }
    out.push_str(&ptx[at..]);
    Ok(Rewritten { ptx: out, kernels })
}

/// Whether the entry can be sliced; if so, how many parameters it has and where the appended
/// ones start.
fn refusal(ptx: &str, f: &Function, u: &Use, taints: &Taints) -> Result<(usize, u32), Refusal> {
    if f.cluster || u.cluster {
        return Err(Refusal::Cluster);
    }
    if u.grid_id {
        return Err(Refusal::GridId);
    }
    if u.vector_index {
        return Err(Refusal::VectorIndex);
    }
    if let Some(v) = u.variables.first() {
        return Err(Refusal::ModuleVariable((*v).to_owned()));
    }
    for callee in &u.calls {
        match taints.get(callee) {
            Some(Taint::Unknown) => return Err(Refusal::UnknownCallee((*callee).to_owned())),
            Some(Taint::ReadsIndex) => return Err(Refusal::CalleeReadsIndex((*callee).to_owned())),
            Some(Taint::Variable(v)) => return Err(Refusal::ModuleVariable(v.clone())),
            Some(Taint::Cluster) => return Err(Refusal::Cluster),
            Some(Taint::GridId) => return Err(Refusal::GridId),
            None => {}
        }
    }
    let (count, end) = match &f.params {
        Some(p) => params_end(&ptx[p.start + 1..p.end - 1]).ok_or(Refusal::Params)?,
        None => (0, 0),
    };
    let space = if end > PARAM_SPACE {
        PARAM_SPACE_LARGE
    } else {
        PARAM_SPACE
    };
    let at = end.next_multiple_of(4);
    if at + SLICE_PARAM_BYTES > space {
        return Err(Refusal::ParamSpace(end));
    }
    Ok((count, at))
}

/// Writes the sliced copy of the entry whose text starts at `start`.
fn sliced_entry(
    out: &mut String,
    ptx: &str,
    start: usize,
    f: &Function,
    body: Range<usize>,
    u: &Use,
) {
    out.push_str(&ptx[start..f.name.end]);
    out.push_str(SLICE_SUFFIX);
    let extra: String = SLICE_PARAMS
        .iter()
        .map(|p| format!("\t.param .u32 {p}"))
        .collect::<Vec<_>>()
        .join(",\n");
    match &f.params {
        Some(p) => {
            let inside = &ptx[p.start + 1..p.end - 1];
            out.push_str(&ptx[f.name.end..p.start + 1]);
            if inside.trim().is_empty() {
                let _ = write!(out, "\n{extra}\n)");
            } else {
                let _ = write!(out, "{},\n{extra}\n)", inside.trim_end());
            }
            out.push_str(&ptx[p.end..body.start]);
        }
        None => {
            let _ = write!(out, "(\n{extra}\n)");
            out.push_str(&ptx[f.name.end..body.start]);
        }
    }
    // body.start is just after the opening brace.
    out.push_str("\n\t.reg .b32 \t%__ls<9>;\n");
    for (i, axis) in ["x", "y", "z"].iter().enumerate() {
        let _ = writeln!(
            out,
            "\tld.param.u32 \t%__ls{}, [{}];",
            6 + i,
            SLICE_PARAMS[i]
        );
        let _ = writeln!(out, "\tmov.u32 \t%__ls{i}, %ctaid.{axis};");
        let _ = writeln!(out, "\tadd.u32 \t%__ls{i}, %__ls{i}, %__ls{};", 6 + i);
        let _ = writeln!(
            out,
            "\tld.param.u32 \t%__ls{}, [{}];",
            3 + i,
            SLICE_PARAMS[3 + i]
        );
    }
    let mut at = body.start;
    for (r, reg) in &u.index_reads {
        out.push_str(&ptx[at..r.start]);
        let _ = write!(out, "%__ls{reg}");
        at = r.end;
    }
    out.push_str(&ptx[at..body.end]);
    out.push('}');
}

/// How many parameters a parameter list declares and where the last one ends (its byte size
/// with alignment), or `None` for a declaration this does not know.
fn params_end(list: &str) -> Option<(usize, u32)> {
    let mut end = 0u32;
    let mut count = 0usize;
    for decl in split_top(list) {
        let words = words(decl);
        if words.is_empty() {
            continue;
        }
        count += 1;
        let mut align = None;
        let mut size = None;
        let mut elements = 1u32;
        let mut pointer = false;
        let mut i = 0;
        while i < words.len() {
            let w = words[i];
            if w == ".ptr" {
                // What follows (`.global`, `.align N`) describes the pointed-to data.
                pointer = true;
            } else if w == ".align" && pointer {
                i += 2;
                continue;
            } else if w == ".align" {
                align = Some(words.get(i + 1)?.parse::<u32>().ok()?);
                i += 2;
                continue;
            }
            if let Some(t) = w.strip_prefix('.') {
                if let Some(s) = type_size(t) {
                    size = Some(s);
                }
            } else if w.starts_with('[') {
                let n = w.trim_start_matches('[').trim_end_matches(']');
                elements = elements.checked_mul(n.parse().ok()?)?;
            }
            i += 1;
        }
        let size = size?;
        let align = align.unwrap_or(size).max(1);
        end = end
            .next_multiple_of(align)
            .checked_add(size.checked_mul(elements)?)?;
    }
    Some((count, end))
}

fn type_size(t: &str) -> Option<u32> {
    Some(match t {
        "b8" | "u8" | "s8" => 1,
        "b16" | "u16" | "s16" | "f16" | "bf16" => 2,
        "b32" | "u32" | "s32" | "f32" | "f16x2" | "bf16x2" => 4,
        "b64" | "u64" | "s64" | "f64" | "texref" | "samplerref" | "surfref" => 8,
        "b128" => 16,
        _ => return None,
    })
}

/// A declaration's words: directives, names, numbers and `[N]` groups.
fn words(decl: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let b = decl.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i].is_ascii_whitespace() {
            i += 1;
        } else if b[i] == b'[' {
            let j = decl[i..].find(']').map_or(b.len(), |p| i + p + 1);
            out.push(&decl[i..j]);
            i = j;
        } else {
            let j = (i + 1..b.len())
                .find(|&j| b[j].is_ascii_whitespace() || b[j] == b'[' || b[j] == b'.')
                .unwrap_or(b.len());
            out.push(&decl[i..j]);
            i = j;
        }
    }
    out
}

/// `list` split at its top-level commas.
fn split_top(list: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut depth = 0i32;
    let mut start = 0;
    for (i, c) in list.char_indices() {
        match c {
            '(' | '[' | '{' => depth += 1,
            ')' | ']' | '}' => depth -= 1,
            ',' if depth == 0 => {
                out.push(&list[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&list[start..]);
    out
}

// ---------------------------------------------------------------------------------------------
// What a function body names.

struct Known<'a> {
    funcs: HashSet<&'a str>,
    variables: HashSet<&'a str>,
    entries: HashSet<&'a str>,
}

#[derive(Default, Debug)]
struct Use<'a> {
    /// `%ctaid.*` (0-2) and `%nctaid.*` (3-5) reads, in text order.
    index_reads: Vec<(Range<usize>, usize)>,
    vector_index: bool,
    cluster: bool,
    grid_id: bool,
    calls: Vec<&'a str>,
    variables: Vec<&'a str>,
    entries: Vec<&'a str>,
}

fn uses<'a>(ptx: &'a str, body: Range<usize>, known: &Known<'a>) -> Use<'a> {
    let mut u = Use::default();
    let b = ptx.as_bytes();
    let mut i = body.start;
    while i < body.end {
        let c = b[i];
        if let Some(j) = skip_comment_or_string(b, i) {
            i = j;
        } else if c == b'.' || c.is_ascii_digit() {
            // A suffix or directive (`.u32`, `.param`) or a number: not a name.
            i += 1;
            while i < body.end && is_ident_char(b[i]) {
                i += 1;
            }
        } else if is_ident_start(c) {
            let start = i;
            i += 1;
            while i < body.end && is_ident_char(b[i]) {
                i += 1;
            }
            let word = &ptx[start..i];
            match word {
                "%ctaid" | "%nctaid" => {
                    let axis = (i + 1 < body.end && b[i] == b'.')
                        .then(|| b"xyz".iter().position(|&a| a == b[i + 1]))
                        .flatten()
                        .filter(|_| i + 2 >= body.end || !is_ident_char(b[i + 2]));
                    match axis {
                        Some(a) => {
                            let reg = if word == "%ctaid" { a } else { 3 + a };
                            u.index_reads.push((start..i + 2, reg));
                            i += 2;
                        }
                        None => u.vector_index = true,
                    }
                }
                "%gridid" => u.grid_id = true,
                w if CLUSTER_REGISTERS.contains(&w) => u.cluster = true,
                w if known.funcs.contains(w) => u.calls.push(w),
                w if known.variables.contains(w) => u.variables.push(w),
                w if known.entries.contains(w) => u.entries.push(w),
                _ => {}
            }
        } else {
            i += 1;
        }
    }
    u
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Taint {
    /// Declared here, defined elsewhere.
    Unknown,
    ReadsIndex,
    Variable(String),
    Cluster,
    GridId,
}

type Taints<'a> = HashMap<&'a str, Taint>;

/// What each function (with what it calls, transitively) does that a sliced kernel could not.
fn taints<'a>(funcs: &HashMap<&'a str, Option<Use<'a>>>) -> Taints<'a> {
    let own = |u: &Use<'a>| -> Option<Taint> {
        if u.cluster {
            Some(Taint::Cluster)
        } else if u.grid_id {
            Some(Taint::GridId)
        } else if !u.index_reads.is_empty() || u.vector_index {
            Some(Taint::ReadsIndex)
        } else {
            u.variables
                .first()
                .map(|v| Taint::Variable((*v).to_owned()))
        }
    };
    let mut t: Taints<'a> = HashMap::new();
    for (name, u) in funcs {
        match u {
            None if !DRIVER_FUNCTIONS.contains(name) => {
                t.insert(name, Taint::Unknown);
            }
            None => {}
            Some(u) => {
                if let Some(x) = own(u) {
                    t.insert(name, x);
                }
            }
        }
    }
    loop {
        let mut changed = false;
        for (name, u) in funcs {
            let Some(u) = u else { continue };
            if t.contains_key(name) {
                continue;
            }
            if let Some(x) = u.calls.iter().find_map(|c| t.get(c)).cloned() {
                t.insert(name, x);
                changed = true;
            }
        }
        if !changed {
            return t;
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The module's top-level statements.

struct Item {
    /// From the first byte of the statement to just after its `;` or body's `}`.
    span: Range<usize>,
    kind: ItemKind,
}

enum ItemKind {
    Function(Function),
    /// Names of module-scope `.global`, `.const`, texture, sampler or surface variables.
    Variables(Vec<Range<usize>>),
    /// Anything else; `version` for the `.version` directive.
    Other {
        version: bool,
    },
}

struct Function {
    entry: bool,
    name: Range<usize>,
    /// The parameter list with its parentheses (`.func`: the one after the name).
    params: Option<Range<usize>>,
    /// Just after `{` to just before `}`; `None` for a declaration.
    body: Option<Range<usize>>,
    /// `.explicitcluster`, `.reqnctapercluster` or `.maxclusterrank` in the header.
    cluster: bool,
}

fn is_ident_start(b: u8) -> bool {
    b.is_ascii_alphabetic() || b == b'_' || b == b'$' || b == b'%'
}

fn is_ident_char(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_' || b == b'$'
}

/// The end of a comment or string literal starting at `i`, if one does.
fn skip_comment_or_string(b: &[u8], i: usize) -> Option<usize> {
    let rest = &b[i..];
    if rest.starts_with(b"//") {
        Some(
            rest.iter()
                .position(|&c| c == b'\n')
                .map_or(b.len(), |p| i + p),
        )
    } else if rest.starts_with(b"/*") {
        Some(
            rest[2..]
                .windows(2)
                .position(|w| w == b"*/")
                .map_or(b.len(), |p| i + 2 + p + 2),
        )
    } else if rest[0] == b'"' {
        let mut j = i + 1;
        while j < b.len() && b[j] != b'"' {
            j += if b[j] == b'\\' { 2 } else { 1 };
        }
        Some((j + 1).min(b.len()))
    } else {
        None
    }
}

/// The index just after the bracket matching the opening one at `open`.
fn matching(b: &[u8], open: usize, end: usize) -> Result<usize, PtxError> {
    let (o, c, what) = match b[open] {
        b'{' => (b'{', b'}', "brace"),
        b'(' => (b'(', b')', "parenthesis"),
        _ => unreachable!("matching() starts at an opening bracket"),
    };
    let mut depth = 0usize;
    let mut i = open;
    while i < end {
        if let Some(j) = skip_comment_or_string(b, i) {
            i = j;
            continue;
        }
        if b[i] == o {
            depth += 1;
        } else if b[i] == c {
            depth -= 1;
            if depth == 0 {
                return Ok(i + 1);
            }
        }
        i += 1;
    }
    Err(PtxError::Unbalanced { what, at: open })
}

/// Module directives that end at the end of their line, without `;`.
const LINE_DIRECTIVES: [&str; 4] = [".version", ".target", ".address_size", ".file"];

fn items(ptx: &str) -> Result<Vec<Item>, PtxError> {
    let b = ptx.as_bytes();
    let n = b.len();
    let mut out = Vec::new();
    let mut i = 0;
    loop {
        while i < n {
            if let Some(j) = skip_comment_or_string(b, i) {
                i = j;
            } else if b[i].is_ascii_whitespace() {
                i += 1;
            } else {
                break;
            }
        }
        if i >= n {
            return Ok(out);
        }
        let start = i;
        if LINE_DIRECTIVES.iter().any(|d| {
            ptx[start..].starts_with(d)
                && b.get(start + d.len()).is_some_and(u8::is_ascii_whitespace)
        }) {
            let end = ptx[start..].find('\n').map_or(n, |p| start + p);
            out.push(Item {
                span: start..end,
                kind: ItemKind::Other {
                    version: ptx[start..].starts_with(".version"),
                },
            });
            i = end;
            continue;
        }
        let mut saw_eq = false;
        let mut end = None;
        let mut body = None;
        while i < n {
            if let Some(j) = skip_comment_or_string(b, i) {
                i = j;
                continue;
            }
            match b[i] {
                b'=' => saw_eq = true,
                b'(' | b'[' => {
                    i = if b[i] == b'(' {
                        matching(b, i, n)?
                    } else {
                        ptx[i..].find(']').map_or(n, |p| i + p + 1)
                    };
                    continue;
                }
                b'{' if !saw_eq => {
                    let close = matching(b, i, n)?;
                    body = Some(i + 1..close - 1);
                    end = Some(close);
                    break;
                }
                b'{' => {
                    i = matching(b, i, n)?;
                    continue;
                }
                b';' => {
                    end = Some(i + 1);
                    break;
                }
                b'}' | b')' => {
                    return Err(PtxError::Unbalanced {
                        what: if b[i] == b'}' { "brace" } else { "parenthesis" },
                        at: i,
                    })
                }
                _ => {}
            }
            i += 1;
        }
        // A trailing statement without `;` (whitespace only after) is kept as it is.
        let end = end.unwrap_or(n);
        let header_end = body.as_ref().map_or(end, |r| r.start - 1);
        let kind = classify(ptx, start..header_end, body)?;
        out.push(Item {
            span: start..end,
            kind,
        });
        i = end;
    }
}

/// A function header as read so far: whether an entry, its name, its parameter list.
type Header = (bool, Option<Range<usize>>, Option<Range<usize>>);

/// What a statement is, from its header (the text before its body or `;`).
fn classify(
    ptx: &str,
    header: Range<usize>,
    body: Option<Range<usize>>,
) -> Result<ItemKind, PtxError> {
    let b = ptx.as_bytes();
    let mut directives: Vec<&str> = Vec::new();
    let mut names: Vec<Range<usize>> = Vec::new();
    let mut groups: Vec<Range<usize>> = Vec::new();
    // `.entry` or `.func`: whether an entry, the first name after it (outside parentheses)
    // and the group after that.
    let mut function: Option<Header> = None;
    let mut before_eq = true;
    let mut i = header.start;
    while i < header.end {
        let c = b[i];
        if let Some(j) = skip_comment_or_string(b, i) {
            i = j;
        } else if c == b'.' && i + 1 < header.end && is_ident_char(b[i + 1]) {
            let mut j = i + 1;
            while j < header.end && is_ident_char(b[j]) {
                j += 1;
            }
            let d = &ptx[i + 1..j];
            if (d == "entry" || d == "func") && function.is_none() {
                function = Some((d == "entry", None, None));
            }
            directives.push(d);
            i = j;
        } else if c == b'(' {
            let close = matching(b, i, header.end)?;
            groups.push(i..close);
            if let Some((_, Some(_), params @ None)) = &mut function {
                *params = Some(i..close);
            }
            i = close;
        } else if c == b'[' {
            i = ptx[i..header.end]
                .find(']')
                .map_or(header.end, |p| i + p + 1);
        } else if c == b'=' {
            before_eq = false;
            i += 1;
        } else if c.is_ascii_digit() {
            while i < header.end && (is_ident_char(b[i]) || b[i] == b'.') {
                i += 1;
            }
        } else if is_ident_start(c) {
            let mut j = i + 1;
            while j < header.end && is_ident_char(b[j]) {
                j += 1;
            }
            if let Some((_, name @ None, _)) = &mut function {
                *name = Some(i..j);
            } else if before_eq {
                names.push(i..j);
            }
            i = j;
        } else {
            i += 1;
        }
    }
    if let Some((entry, name, params)) = function {
        let name = name.ok_or(PtxError::Unnamed(header.start))?;
        let cluster = directives.iter().any(|d| CLUSTER_DIRECTIVES.contains(d));
        return Ok(ItemKind::Function(Function {
            entry,
            name,
            params,
            body,
            cluster,
        }));
    }
    let shared_state = ["global", "const", "tex", "texref", "samplerref", "surfref"];
    if body.is_none() && directives.iter().any(|d| shared_state.contains(d)) {
        return Ok(ItemKind::Variables(names));
    }
    Ok(ItemKind::Other {
        version: directives.first() == Some(&"version"),
    })
}

#[cfg(test)]
mod tests;
