//! The three walks of structured merge over an object and its [`Shape`], with structured-merge-diff's semantics:
//! the set of fields an applied configuration sets ([`to_set`]), the merge of a configuration into the live object
//! ([`merge`]), and what changed between two objects ([`compare`]).

use super::fieldpath::{path_string, PathElement, Set};
use super::shape::{ListKind, Shape};
use serde_json::{Map, Value};
use std::collections::{BTreeMap, HashMap};

static UNTYPED: Shape = Shape::Untyped;
static NO_FIELDS: BTreeMap<String, Shape> = BTreeMap::new();

/// A node as the walks treat it.
enum Node<'s> {
    /// Compared and owned as one value.
    Leaf,
    Object(&'s BTreeMap<String, Shape>, Option<&'s Shape>),
    List(&'s Shape, &'s ListKind),
}

fn node<'s>(shape: &'s Shape, v: &Value) -> Node<'s> {
    match (shape, v) {
        (Shape::Object { atomic: false, fields, values }, Value::Object(_)) => Node::Object(fields, values.as_deref()),
        (Shape::Untyped, Value::Object(_)) => Node::Object(&NO_FIELDS, Some(&UNTYPED)),
        (Shape::List { items, kind }, Value::Array(_)) if *kind != ListKind::Atomic => Node::List(items, kind),
        _ => Node::Leaf,
    }
}

fn field_shape<'s>(fields: &'s BTreeMap<String, Shape>, values: Option<&'s Shape>, key: &str) -> &'s Shape {
    fields.get(key).or(values).unwrap_or(&UNTYPED)
}

/// Why a configuration or object cannot be walked, as structured-merge-diff words it.
#[derive(Debug, thiserror::Error)]
pub enum Malformed {
    #[error(
        "element {index}: associative list with keys has an element that omits key field {key:?} (and doesn't have default value)"
    )]
    MissingKey { index: usize, key: String },
    /// The key as a path element prints it.
    #[error("duplicate entries for key {0}")]
    DuplicateKey(String),
}

/// A [`Malformed`] list and where it is (the path as [`path_string`] writes it; empty at the root).
#[derive(Debug, thiserror::Error)]
#[error("{path}{}{problem}", if path.is_empty() { "" } else { ": " })]
pub struct WalkError {
    path: String,
    problem: Malformed,
}

/// The element of a list item: its key fields, or its value.
fn item_element(item: &Value, kind: &ListKind, index: usize) -> Result<PathElement, Malformed> {
    match kind {
        ListKind::Set => Ok(PathElement::Value(item.to_string())),
        ListKind::Atomic => Ok(PathElement::Index(index)),
        ListKind::Map(keys) => {
            let mut fields = Vec::with_capacity(keys.len());
            for key in keys {
                match item.get(key) {
                    Some(v) => fields.push((key.clone(), v.clone())),
                    None => return Err(Malformed::MissingKey { index, key: key.clone() }),
                }
            }
            Ok(PathElement::key(fields))
        }
    }
}

fn at(path: &[PathElement], problem: Malformed) -> WalkError {
    WalkError { path: path_string(path), problem }
}

fn duplicate(pe: &PathElement) -> Malformed {
    Malformed::DuplicateKey(path_string(std::slice::from_ref(pe)))
}

/// The fields `v` sets: its leaves, every list item, and map entries and empty objects themselves. A live object
/// may hold an item twice under one key (it is owned as a whole).
pub fn to_set(v: &Value, shape: &Shape) -> Result<Set, WalkError> {
    let mut set = Set::default();
    set_of(v, shape, true, &mut Vec::new(), &mut set)?;
    Ok(set)
}

/// [`to_set`] of an applied configuration, which may not hold an item twice.
pub fn config_set(v: &Value, shape: &Shape) -> Result<Set, WalkError> {
    let mut set = Set::default();
    set_of(v, shape, false, &mut Vec::new(), &mut set)?;
    Ok(set)
}

fn set_of(
    v: &Value,
    shape: &Shape,
    duplicates: bool,
    path: &mut Vec<PathElement>,
    set: &mut Set,
) -> Result<(), WalkError> {
    match node(shape, v) {
        Node::Leaf => set.insert(path),
        Node::Object(fields, values) => {
            for (k, child) in v.as_object().into_iter().flatten() {
                path.push(PathElement::Field(k.clone()));
                set_of(child, field_shape(fields, values, k), duplicates, path, set)?;
                let empty = child.is_null() || child.as_object().is_some_and(Map::is_empty);
                if empty || !fields.contains_key(k) {
                    set.insert(path);
                }
                path.pop();
            }
        }
        Node::List(items, kind) => {
            let list = v.as_array().map(Vec::as_slice).unwrap_or_default();
            let mut seen: HashMap<PathElement, usize> = HashMap::new();
            for (i, item) in list.iter().enumerate() {
                let pe = item_element(item, kind, i).map_err(|e| at(path, e))?;
                let n = seen.entry(pe).or_default();
                *n += 1;
                if *n > 1 && !duplicates {
                    let pe = item_element(item, kind, i).map_err(|e| at(path, e))?;
                    return Err(at(path, duplicate(&pe)));
                }
            }
            for (i, item) in list.iter().enumerate() {
                let pe = item_element(item, kind, i).map_err(|e| at(path, e))?;
                let duplicated = seen[&pe] > 1;
                path.push(pe);
                // A duplicated item is owned as a whole.
                if !duplicated {
                    set_of(item, items, duplicates, path, set)?;
                }
                set.insert(path);
                path.pop();
            }
        }
    }
    Ok(())
}

/// `config` merged into `live`: objects field by field, map lists and sets item by item, everything else replaced.
pub fn merge(live: &Value, config: &Value, shape: &Shape) -> Result<Value, WalkError> {
    merge_at(live, config, shape, &mut Vec::new())
}

fn merge_at(live: &Value, config: &Value, shape: &Shape, path: &mut Vec<PathElement>) -> Result<Value, WalkError> {
    if config.is_null() {
        // A granular object or list set to null merges as an empty one: the live entries stay (structured-merge-diff
        // reads null as empty there), and the applier owns the field as a whole.
        let keeps = match (shape, live) {
            (Shape::Object { atomic: false, .. } | Shape::Untyped, Value::Object(_)) => true,
            (Shape::List { kind, .. }, Value::Array(_)) => *kind != ListKind::Atomic,
            _ => false,
        };
        return Ok(if keeps { live.clone() } else { Value::Null });
    }
    match (node(shape, config), live, config) {
        (Node::Object(fields, values), Value::Object(l), Value::Object(c)) => {
            // Each live entry is copied once: those the configuration names are merged, the others taken as they are.
            let mut out = Map::new();
            for (k, lv) in l {
                let merged = match c.get(k) {
                    Some(cv) => {
                        path.push(PathElement::Field(k.clone()));
                        let m = merge_at(lv, cv, field_shape(fields, values, k), path)?;
                        path.pop();
                        m
                    }
                    None => lv.clone(),
                };
                out.insert(k.clone(), merged);
            }
            for (k, cv) in c.iter().filter(|(k, _)| !l.contains_key(*k)) {
                out.insert(k.clone(), cv.clone());
            }
            Ok(Value::Object(out))
        }
        (Node::List(items, kind), Value::Array(l), Value::Array(c)) => merge_list(l, c, items, kind, path),
        _ => Ok(config.clone()),
    }
}

/// Items of both lists, merged: the configuration's order for the items it names, the live items it does not name
/// kept in place among them (structured-merge-diff's order).
fn merge_list(
    live: &[Value],
    config: &[Value],
    items: &Shape,
    kind: &ListKind,
    path: &mut Vec<PathElement>,
) -> Result<Value, WalkError> {
    let index = |list: &[Value]| -> Result<Vec<PathElement>, WalkError> {
        list.iter().enumerate().map(|(i, item)| item_element(item, kind, i).map_err(|e| at(path, e))).collect()
    };
    let (lpes, cpes) = (index(live)?, index(config)?);
    let mut in_config: HashMap<&PathElement, &Value> = HashMap::new();
    for (pe, item) in cpes.iter().zip(config) {
        if in_config.insert(pe, item).is_some() {
            return Err(at(path, duplicate(pe)));
        }
    }
    // A live item duplicated under one key is not merged with the configuration's (nothing to merge into).
    let mut in_live: HashMap<&PathElement, Option<&Value>> = HashMap::new();
    for (pe, item) in lpes.iter().zip(live) {
        in_live.entry(pe).and_modify(|v| *v = None).or_insert(Some(item));
    }
    let mut shared = cpes.iter().filter(|pe| in_live.contains_key(pe));
    let mut next_shared = shared.next();
    let mut merged_config: std::collections::HashSet<&PathElement> = std::collections::HashSet::new();
    let mut out = Vec::with_capacity(live.len().max(config.len()));
    let merge_item = |pe: &PathElement, l: Option<&Value>, c: &Value, path: &mut Vec<PathElement>| {
        path.push(pe.clone());
        let m = match l {
            Some(l) => merge_at(l, c, items, path),
            None => Ok(c.clone()),
        };
        path.pop();
        m
    };
    let (mut li, mut ci) = (0, 0);
    while li < lpes.len() || ci < cpes.len() {
        if li < lpes.len() && ci < cpes.len() {
            let pe = &lpes[li];
            if *pe == cpes[ci] {
                merged_config.insert(pe);
                out.push(merge_item(pe, in_live[pe], in_config[pe], path)?);
                li += 1;
                ci += 1;
                next_shared = shared.next();
                continue;
            }
            if in_config.contains_key(pe) && next_shared.is_some_and(|n| n != pe) {
                // A shared item, but not the next one in the configuration's order: it comes later.
                li += 1;
                continue;
            }
        }
        if li < lpes.len() {
            let pe = &lpes[li];
            if !in_config.contains_key(pe) {
                out.push(live[li].clone());
                li += 1;
                continue;
            } else if merged_config.contains(pe) {
                li += 1;
            }
        }
        if ci < cpes.len() {
            let pe = &cpes[ci];
            merged_config.insert(pe);
            out.push(merge_item(pe, in_live.get(pe).copied().flatten(), in_config[pe], path)?);
            ci += 1;
            if next_shared == Some(pe) {
                next_shared = shared.next();
            }
        }
    }
    Ok(Value::Array(out))
}

/// What differs between two objects, by path.
#[derive(Debug, Default)]
pub struct Comparison {
    pub added: Set,
    pub modified: Set,
    pub removed: Set,
}

impl Comparison {
    /// Added or modified: the fields a write takes ownership of.
    pub fn changed(&self) -> Set {
        self.added.union(&self.modified)
    }
}

pub fn compare(old: &Value, new: &Value, shape: &Shape) -> Comparison {
    let mut c = Comparison::default();
    compare_at(Some(old), Some(new), shape, &mut Vec::new(), &mut c);
    c
}

fn is_empty_container(v: Option<&Value>) -> bool {
    match v {
        None | Some(Value::Null) => true,
        Some(Value::Object(m)) => m.is_empty(),
        Some(Value::Array(a)) => a.is_empty(),
        _ => false,
    }
}

fn same_type(a: &Value, b: &Value) -> bool {
    matches!((a, b), (Value::Object(_), Value::Object(_)) | (Value::Array(_), Value::Array(_)))
}

fn compare_at(
    old: Option<&Value>,
    new: Option<&Value>,
    shape: &Shape,
    path: &mut Vec<PathElement>,
    c: &mut Comparison,
) {
    // An empty object where there was none is no field. kube-apiserver compares a create with the zero object of
    // the Go type, in which a struct is `{}` and an empty map tagged omitempty is absent: either way an empty
    // object added where there was none owns nothing (a Namespace created with `spec: {}`, or with only unknown
    // fields in it, owns no `f:spec`; v1.37.2 answers so).
    let absent_or_empty_object = |v: Option<&Value>| v.is_none_or(|v| v.as_object().is_some_and(Map::is_empty));
    if absent_or_empty_object(old) && absent_or_empty_object(new) && (old.is_none() || new.is_none()) {
        return;
    }
    let Some(v) = new.or(old) else { return };
    // Both empty (or absent): one value, so that empty and null stay apart; values of different types likewise.
    let mixed = old.zip(new).is_some_and(|(o, n)| !same_type(o, n));
    if mixed || (is_empty_container(old) && is_empty_container(new)) {
        return compare_leaf(old, new, path, c);
    }
    match node(shape, v) {
        Node::Leaf => return compare_leaf(old, new, path, c),
        Node::Object(fields, values) => {
            let empty = Map::new();
            let (o, n) =
                (old.and_then(Value::as_object).unwrap_or(&empty), new.and_then(Value::as_object).unwrap_or(&empty));
            let keys: std::collections::BTreeSet<&String> = o.keys().chain(n.keys()).collect();
            for k in keys {
                path.push(PathElement::Field(k.clone()));
                compare_at(o.get(k), n.get(k), field_shape(fields, values, k), path, c);
                path.pop();
            }
        }
        Node::List(items, kind) => {
            let (o, n) = (index_items(old, kind), index_items(new, kind));
            let pes: std::collections::BTreeSet<&PathElement> = o.keys().chain(n.keys()).collect();
            for pe in pes {
                path.push(pe.clone());
                compare_at(o.get(pe).copied(), n.get(pe).copied(), items, path, c);
                path.pop();
            }
        }
    }
    match (old, new) {
        (None, _) => c.added.insert(path),
        (_, None) => c.removed.insert(path),
        _ => {}
    }
}

/// A list's items by element; an item whose key is missing cannot be told apart and is left out.
fn index_items<'v>(list: Option<&'v Value>, kind: &ListKind) -> BTreeMap<PathElement, &'v Value> {
    let items = list.and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default();
    items.iter().enumerate().filter_map(|(i, it)| item_element(it, kind, i).ok().map(|pe| (pe, it))).collect()
}

fn compare_leaf(old: Option<&Value>, new: Option<&Value>, path: &[PathElement], c: &mut Comparison) {
    match (old, new) {
        (None, _) => c.added.insert(path),
        (_, None) => c.removed.insert(path),
        (Some(o), Some(n)) if o != n => c.modified.insert(path),
        _ => {}
    }
}

/// Removes from `v` what `remove` names, structured-merge-diff's prune: a list item or map entry in it goes whole;
/// a declared field in it (or whose parts in it are all that was there) goes whole unless someone still owns
/// something in it, in which case only those of its parts in `remove` go. One walk: each item's element is computed
/// once.
pub fn prune(v: &mut Value, shape: &Shape, remove: &Set, owned: Option<&Set>) {
    let owned_below = |pe: &PathElement| owned.and_then(|o| o.child(pe)).is_some_and(|c| !c.is_empty());
    let owned_member = |pe: &PathElement| owned.is_some_and(|o| o.contains(std::slice::from_ref(pe)));
    match node(shape, v) {
        Node::Leaf => {}
        Node::Object(fields, values) => {
            let Some(m) = v.as_object_mut() else { return };
            let keys: Vec<String> = m.keys().cloned().collect();
            for k in keys {
                let pe = PathElement::Field(k.clone());
                let named = remove.contains(std::slice::from_ref(&pe));
                let below = remove.child(&pe);
                let whole = match fields.contains_key(&k) {
                    true => (named || below.is_some()) && !owned_below(&pe) && !owned_member(&pe),
                    false => named,
                };
                if whole {
                    m.remove(&k);
                } else if let (Some(below), Some(child)) = (below, m.get_mut(&k)) {
                    prune(child, field_shape(fields, values, &k), below, owned.and_then(|o| o.child(&pe)));
                }
            }
        }
        Node::List(items, kind) => {
            let Some(list) = v.as_array_mut() else { return };
            let mut index = 0;
            list.retain_mut(|item| {
                let Ok(pe) = item_element(item, kind, index) else {
                    index += 1;
                    return true;
                };
                index += 1;
                if remove.contains(std::slice::from_ref(&pe)) {
                    return false;
                }
                if let Some(below) = remove.child(&pe) {
                    prune(item, items, below, owned.and_then(|o| o.child(&pe)));
                }
                true
            });
        }
    }
}
