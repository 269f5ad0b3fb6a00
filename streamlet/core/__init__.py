"""The model and the in-process runtime. Imports nothing from transport, backends or adaptation."""
