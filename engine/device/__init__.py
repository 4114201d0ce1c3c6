"""The device side: the program (the weights on the device and their compiled forwards,
`program`), where it runs (`placement`), the paged KV pool it owns (`kv_pool`) and its export
for other platforms (`export`)."""
