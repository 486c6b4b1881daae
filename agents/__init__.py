"""Evolution agents built on genesis-fp16."""
