"""pdlink as an SGLang transfer backend: --disaggregation-transfer-backend pdlink.

SGLang loads pdlink.sglang.plugin:register through its general-plugin entry
point (group sglang.srt.plugins); nothing here imports SGLang until then, so
`import pdlink` stays light. The classes live in pdlink.sglang.conn, the
start-up refusals in pdlink.sglang.checks, the staging slots in
pdlink.sglang.staging.
"""

# The one SGLang release the backend is tested against (python/tests/sglang,
# requirements/sglang.txt). SGLang's disaggregation classes change between
# releases, so any other version is refused at start.
TESTED_SGLANG_VERSION = "0.5.23"

# The --disaggregation-transfer-backend value.
BACKEND_NAME = "pdlink"
