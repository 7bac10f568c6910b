"""The prepare steps every claim goes through whatever its sharing mode: the device nodes it may open
(`device_access`), its state directory (`directories`), the driver's per-container memory limits where the
node has them (`driver_memory`), and the limits recorded for the usage monitor (`usage_facts`)."""
