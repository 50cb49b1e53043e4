//! Attribute lists (KeyValue) ⇄ the Arrow attributes map column.
