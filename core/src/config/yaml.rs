//! YAML with positions.
use crate::component::PathSeg;
use super::Location;
/// A YAML node with its position.
#[derive(Debug, Clone)]
pub struct Node;
impl Node {
    /// Location of a path below this node.
    pub fn locate(&self, _path: &[PathSeg]) -> Option<Location> { None }
}
