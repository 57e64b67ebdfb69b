"""The files prep writes between stages and reads back for history: their byte layouts, readers and writers."""
