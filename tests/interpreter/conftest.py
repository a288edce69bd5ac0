import os

if os.environ.get("TRITON_INTERPRET") == "1":
    from tests.interpreter import interpreter_compat

    interpreter_compat.install()
