"""The emulated network: namespaces, bridges, veth links and their shaping."""
