//! Field paths and sets of them, as structured-merge-diff defines them, and their `fieldsV1` form: each managedFields
//! entry records the set of paths its manager owns.
//!
//! A path is a list of elements: an object's field (`f:name`), a map list's item by its key fields
//! (`k:{"type":"Running"}`), a set's item by its value (`v:"a"`), or a list item by position (`i:0`). A [`Set`] is a
//! set of paths, kept as a tree: `members` are the paths that end at this node, `children` the subtrees. In
//! `fieldsV1` a member that also has children is marked by a `"."` key inside its object.

use crate::registry::decode::MAX_NESTING_DEPTH;
use serde_json::{Map, Value};
use std::collections::{BTreeMap, BTreeSet};

/// The longest path a set records. A path of n elements is an object nested 5 + n levels deep in the stored
/// object (`metadata.managedFields[i].fieldsV1` and one level per element), and stored objects nest at most
/// [`MAX_NESTING_DEPTH`] levels: the fields of an object near that limit are owned through their ancestor at this
/// depth (kube-apiserver, which allows far deeper objects, has no such cut).
pub const MAX_PATH_LEN: usize = MAX_NESTING_DEPTH - 5;

/// One step of a path. Keys and values are kept as their JSON text, which is how `fieldsV1` spells them and gives
/// them an order.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum PathElement {
    Field(String),
    /// The key fields of a map list's item, sorted by name, each with its value as JSON.
    Key(Vec<(String, String)>),
    /// A set item, as JSON.
    Value(String),
    Index(usize),
}

impl PathElement {
    /// A map list item's element: its key fields, sorted by name.
    pub fn key(fields: impl IntoIterator<Item = (String, Value)>) -> PathElement {
        let mut k: Vec<(String, String)> = fields.into_iter().map(|(n, v)| (n, v.to_string())).collect();
        k.sort();
        PathElement::Key(k)
    }

    /// The element's `fieldsV1` key.
    fn encode(&self) -> String {
        match self {
            PathElement::Field(f) => format!("f:{f}"),
            PathElement::Key(k) => {
                let fields: Vec<String> = k.iter().map(|(n, v)| format!("{}:{v}", Value::from(n.as_str()))).collect();
                format!("k:{{{}}}", fields.join(","))
            }
            PathElement::Value(v) => format!("v:{v}"),
            PathElement::Index(i) => format!("i:{i}"),
        }
    }

    fn decode(s: &str) -> Result<PathElement, FieldsV1Error> {
        let unknown = || FieldsV1Error::UnknownElement(s.to_string());
        let (kind, rest) = s.split_once(':').ok_or_else(unknown)?;
        let json = |t: &str| serde_json::from_str::<Value>(t).map_err(|e| FieldsV1Error::Json(s.to_string(), e));
        match kind {
            "f" => Ok(PathElement::Field(rest.to_string())),
            "k" => match json(rest)? {
                Value::Object(m) => Ok(PathElement::key(m)),
                _ => Err(FieldsV1Error::KeyNotObject(s.to_string())),
            },
            "v" => Ok(PathElement::Value(json(rest)?.to_string())),
            "i" => rest.parse().map(PathElement::Index).map_err(|_| FieldsV1Error::NotIndex(s.to_string())),
            _ => Err(unknown()),
        }
    }
}

/// Why a `fieldsV1` value is not a field set; an element is quoted as it was stored.
#[derive(Debug, thiserror::Error)]
pub enum FieldsV1Error {
    #[error("fieldsV1 must be a JSON object")]
    NotObject,
    #[error("{0:?}: must be a JSON object")]
    EntryNotObject(String),
    #[error("unknown path element {0:?}")]
    UnknownElement(String),
    #[error("{0:?}: {1}")]
    Json(String, serde_json::Error),
    #[error("{0:?}: a key must be a JSON object")]
    KeyNotObject(String),
    #[error("{0:?}: not an index")]
    NotIndex(String),
}

/// A path as structured-merge-diff prints it in conflicts: `.spec.gardener[name="ca"].data`.
pub fn path_string(path: &[PathElement]) -> String {
    path.iter()
        .map(|pe| match pe {
            PathElement::Field(f) => format!(".{f}"),
            PathElement::Key(k) => {
                format!("[{}]", k.iter().map(|(n, v)| format!("{n}={v}")).collect::<Vec<_>>().join(","))
            }
            PathElement::Value(v) => format!("[={v}]"),
            PathElement::Index(i) => format!("[{i}]"),
        })
        .collect()
}

/// A set of paths.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Set {
    members: BTreeSet<PathElement>,
    children: BTreeMap<PathElement, Set>,
}

impl Set {
    pub fn is_empty(&self) -> bool {
        self.members.is_empty() && self.children.values().all(Set::is_empty)
    }

    /// Adds `path`, or its first [`MAX_PATH_LEN`] elements: deeper fields are owned through that ancestor.
    pub fn insert(&mut self, path: &[PathElement]) {
        self.insert_at(&path[..path.len().min(MAX_PATH_LEN)]);
    }

    fn insert_at(&mut self, path: &[PathElement]) {
        match path {
            [] => {}
            [last] => {
                self.members.insert(last.clone());
            }
            [first, rest @ ..] => self.children.entry(first.clone()).or_default().insert_at(rest),
        }
    }

    pub fn contains(&self, path: &[PathElement]) -> bool {
        match path {
            [] => false,
            [last] => self.members.contains(last),
            [first, rest @ ..] => self.children.get(first).is_some_and(|c| c.contains(rest)),
        }
    }

    /// Whether a path of the set continues below `path`.
    pub fn has_below(&self, path: &[PathElement]) -> bool {
        match path {
            [] => !self.is_empty(),
            [first, rest @ ..] => self.children.get(first).is_some_and(|c| c.has_below(rest)),
        }
    }

    pub fn remove_member(&mut self, pe: &PathElement) {
        self.members.remove(pe);
    }

    pub fn remove_child(&mut self, pe: &PathElement) {
        self.children.remove(pe);
    }

    pub fn child_mut(&mut self, pe: &PathElement) -> Option<&mut Set> {
        self.children.get_mut(pe)
    }

    /// Keeps only the paths through `pe` (the member and the subtree).
    pub fn retain_root(&mut self, pe: &PathElement) {
        self.members.retain(|m| m == pe);
        self.children.retain(|c, _| c == pe);
    }

    /// Drops subtrees left without paths.
    pub fn prune_empty(&mut self) {
        for c in self.children.values_mut() {
            c.prune_empty();
        }
        self.children.retain(|_, c| !c.is_empty());
    }

    /// The child set below `pe`, if any path continues there.
    pub fn child(&self, pe: &PathElement) -> Option<&Set> {
        self.children.get(pe)
    }

    pub fn union(&self, other: &Set) -> Set {
        let mut out = self.clone();
        out.members.extend(other.members.iter().cloned());
        for (pe, c) in &other.children {
            let merged = match out.children.get(pe) {
                Some(mine) => mine.union(c),
                None => c.clone(),
            };
            out.children.insert(pe.clone(), merged);
        }
        out
    }

    pub fn difference(&self, other: &Set) -> Set {
        let members = self.members.difference(&other.members).cloned().collect();
        let children = self
            .children
            .iter()
            .map(|(pe, c)| (pe.clone(), other.children.get(pe).map_or_else(|| c.clone(), |o| c.difference(o))))
            .filter(|(_, c)| !c.is_empty())
            .collect();
        Set { members, children }
    }

    pub fn intersection(&self, other: &Set) -> Set {
        let members = self.members.intersection(&other.members).cloned().collect();
        let children = self
            .children
            .iter()
            .filter_map(|(pe, c)| other.children.get(pe).map(|o| (pe.clone(), c.intersection(o))))
            .filter(|(_, c)| !c.is_empty())
            .collect();
        Set { members, children }
    }

    /// Every path of the set, in order.
    pub fn paths(&self) -> Vec<Vec<PathElement>> {
        let mut out = Vec::new();
        self.collect(&mut Vec::new(), &mut out);
        out
    }

    fn collect(&self, prefix: &mut Vec<PathElement>, out: &mut Vec<Vec<PathElement>>) {
        let mut elements: BTreeSet<&PathElement> = self.members.iter().collect();
        elements.extend(self.children.keys());
        for pe in elements {
            prefix.push(pe.clone());
            if self.members.contains(pe) {
                out.push(prefix.clone());
            }
            if let Some(c) = self.children.get(pe) {
                c.collect(prefix, out);
            }
            prefix.pop();
        }
    }

    /// The `fieldsV1` object.
    pub fn to_fields_v1(&self) -> Value {
        let mut m = Map::new();
        for pe in &self.members {
            m.insert(pe.encode(), Value::Object(Map::new()));
        }
        for (pe, c) in &self.children {
            if c.is_empty() {
                continue;
            }
            let mut inner = c.to_fields_v1();
            if self.members.contains(pe) {
                inner.as_object_mut().map(|o| o.insert(".".into(), Value::Object(Map::new())));
            }
            m.insert(pe.encode(), inner);
        }
        Value::Object(m)
    }

    pub fn from_fields_v1(v: &Value) -> Result<Set, FieldsV1Error> {
        let Value::Object(m) = v else { return Err(FieldsV1Error::NotObject) };
        let mut set = Set::default();
        for (k, inner) in m {
            if k == "." {
                continue;
            }
            let pe = PathElement::decode(k)?;
            let Value::Object(im) = inner else { return Err(FieldsV1Error::EntryNotObject(k.clone())) };
            if im.is_empty() || im.contains_key(".") {
                set.members.insert(pe.clone());
            }
            let child = Set::from_fields_v1(inner)?;
            if !child.is_empty() {
                set.children.insert(pe, child);
            }
        }
        Ok(set)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn f(s: &str) -> PathElement {
        PathElement::Field(s.into())
    }

    #[test]
    fn fields_v1_round_trip_in_upstream_form() {
        let v1 = json!({
            "f:metadata": {"f:labels": {".": {}, "f:app": {}}},
            "f:spec": {"f:gardener": {"k:{\"name\":\"ca\"}": {".": {}, "f:data": {}, "f:name": {}}}},
            "f:status": {"f:conditions": {"k:{\"type\":\"Running\"}": {".": {}, "f:status": {}}}},
            "f:metadata2": {"f:finalizers": {".": {}, "v:\"a\"": {}}}
        });
        let set = Set::from_fields_v1(&v1).unwrap();
        assert_eq!(set.to_fields_v1(), v1);
        assert!(set.contains(&[f("metadata"), f("labels")]));
        assert!(set.contains(&[f("metadata"), f("labels"), f("app")]));
        assert!(!set.contains(&[f("metadata")]), "a parent with children only is not a member");
        let ca = PathElement::key([("name".to_string(), json!("ca"))]);
        assert!(set.contains(&[f("spec"), f("gardener"), ca.clone(), f("data")]));
        assert_eq!(path_string(&[f("spec"), f("gardener"), ca, f("data")]), r#".spec.gardener[name="ca"].data"#);
        assert!(Set::from_fields_v1(&json!({"x:y": {}})).is_err());
        assert!(Set::from_fields_v1(&json!({"f:a": 1})).is_err());
    }

    #[test]
    fn paths_are_cut_where_managed_fields_would_nest_too_deep() {
        let long: Vec<PathElement> = (0..MAX_PATH_LEN + 3).map(|_| f("a")).collect();
        let mut set = Set::default();
        set.insert(&long);
        assert_eq!(set.paths(), [long[..MAX_PATH_LEN].to_vec()]);
    }

    #[test]
    fn set_algebra_is_by_path() {
        let mut a = Set::default();
        a.insert(&[f("spec"), f("x")]);
        a.insert(&[f("spec"), f("y")]);
        let mut b = Set::default();
        b.insert(&[f("spec"), f("y")]);
        b.insert(&[f("spec")]);
        assert_eq!(a.intersection(&b).paths(), [vec![f("spec"), f("y")]]);
        assert_eq!(a.difference(&b).paths(), [vec![f("spec"), f("x")]]);
        assert_eq!(a.union(&b).paths().len(), 3);
        assert!(a.difference(&a).is_empty());
    }
}
