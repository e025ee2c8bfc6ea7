"""Signatures from the libraries around an engine: PyTorch/CUDA, NCCL, Hugging Face hub/transformers/tokenizers,
and the HTTP clients people call a server with (openai-python, httpx, requests, aiohttp, curl).

Texts are the libraries' own (c10/cuda/CUDACachingAllocator.cpp, nccl/src, huggingface_hub/utils/_errors.py,
transformers, openai/_exceptions.py, curl's error table). Engine-specific texts live with the engine.
"""

from __future__ import annotations

from oomguard.failures import FailureClass, Signature

C = FailureClass   # short, for the tables below

# A report that contrasts engine releases ("works in 0.8.1", "reverting to 0.1.29 fixed it", "a regression") points
# at the engine: only its version changed. A release number is required, so "works with --enforce-eager" is not one.
_RELEASE = r"(?:vllm|sglang|ollama|llama\.cpp|version|release|build)?[ =]*v?\d+\.\d+(?:\.\d+)?"
_VERSION_CONTRAST = (r"\bregression\b|\bwork(?:s|ed|ing)?(?: (?:fine|well|ok|correctly|normally))? (?:in|with|on|under) "
                     + _RELEASE + r"|\b(?:run|runs|ran)(?: it)? (?:successfully|fine|without (?:any )?(?:problems?|issues?"
                       r"|errors?)) (?:in|with|on|under) " + _RELEASE + r"|\b(?:roll(?:ing|ed)? ?back|revert(?:ing|ed)?|downgrad(?:e|ed|ing)) (?:\w+ )?(?:to|from) "
                     + _RELEASE + r"|\b(?:since|after|when) (?:upgrad|updat)\w* (?:\w+ )?(?:to|from) " + _RELEASE
                     + r"|\bwork(?:s|ed|ing)?(?: (?:fine|well|ok))? (?:in|with|on) (?:the )?(?:previous|older|earlier|last) "
                       r"(?:versions?|releases?)")
_VERSION_CONTRAST_NEEDLES = ("regression", "works in", "worked in", "works with", "worked with", "works on",
                             "worked on", "works fine", "worked fine", "working fine", "rolling back", "roll back",
                             "rolled back", "rollback", "revert", "downgrad", "upgrad", "updat", "successfully with",
                             "fine with")

SIGNATURES: tuple[Signature, ...] = (
    # --- out of memory (classified later by phase, frames and numbers) ---
    Signature("torch.oom", C.OOM_RUNTIME, "cuda out of memory", 0.8, "c10/cuda/CUDACachingAllocator.cpp", kind="oom"),
    Signature("torch.oom_error", C.OOM_RUNTIME, "outofmemoryerror", 0.8, "torch.cuda.OutOfMemoryError / torch.OutOfMemoryError",
              kind="oom"),
    Signature("cuda.oom", C.OOM_RUNTIME, "cuda error: out of memory", 0.8, "CUDA runtime (cudaErrorMemoryAllocation)",
              kind="oom"),
    Signature("hip.oom", C.OOM_RUNTIME, "hip out of memory", 0.8, "ROCm caching allocator", kind="oom"),
    Signature("generic.oom_words", C.OOM_RUNTIME, "out of memory", 0.7, "generic (any allocator, or a person's words)",
              kind="oom"),
    Signature("generic.oom_dash", C.OOM_RUNTIME, "out-of-memory", 0.7, "generic", kind="oom"),
    Signature("generic.oom", C.OOM_RUNTIME, "oom", 0.65, "a person's words ('OOM')", kind="oom", require=True,
              pattern=r"(?-i:(?:^|(?<=[\s(\[:,'\"]))OOM(?:s|ed|ing)?(?=[\s).,:;!?'\"\]]|$))"),  # the upper-case word
    Signature("cublas.alloc", C.OOM_RUNTIME, "cublas_status_alloc_failed", 0.7, "cuBLAS", kind="oom"),
    Signature("cuda.oom_enum", C.OOM_RUNTIME, "cuda_error_out_of_memory", 0.75, "CUDA driver API", kind="oom"),
    # cublasCreate fails this way when the GPU has no memory left for cuBLAS's handle and workspace
    Signature("cublas.not_initialized", C.OOM_RUNTIME, "cublas_status_not_initialized", 0.6,
              "cuBLAS (cublasCreate; torch/cuda/blas.cpp getCurrentCUDABlasHandle)", kind="oom"),
    # --- other processes / exclusive mode ---
    Signature("prose.not_enough_free", C.GPU_MEMORY_IN_USE, "enough free", 0.55, "a person's words", require=True,
              pattern=r"not enough free (?:gpu |vram |device )?memory",
              cause="Another process (or a previous instance that has not exited) holds GPU memory."),
    Signature("cuda.busy", C.GPU_MEMORY_IN_USE, "all cuda-capable devices are busy or unavailable", 0.85,
              "CUDA runtime (cudaErrorDevicesUnavailable)",
              cause="The GPU is in exclusive-process mode and another process holds it."),
    # --- NCCL / torch.distributed ---
    Signature("nccl.error", C.NCCL, "nccl error", 0.88, "torch/csrc/distributed/c10d/NCCLUtils", cause="NCCL failed."),
    # torch.distributed's rendezvous (TCPStore) before any NCCL communicator exists: ranks that cannot reach the
    # master's address and port (torch/csrc/distributed/c10d/socket.cpp, TCPStore.cpp)
    Signature("c10d.client_timeout", C.NCCL, "the client socket has timed out after", 0.9,
              "torch/csrc/distributed/c10d/socket.cpp:SocketConnectOp", cause="A rank could not reach the "
              "rendezvous address (MASTER_ADDR / the Ray head's IP and port) in time: a firewall, the wrong network "
              "interface, or the other node not started."),
    Signature("c10d.client_connect", C.NCCL, "the client socket has failed to connect to any network address of",
              0.9, "torch/csrc/distributed/c10d/socket.cpp:SocketConnectOp", cause="A rank could not reach the "
              "rendezvous address: wrong MASTER_ADDR/port, a firewall, or the wrong network interface."),
    Signature("c10d.server_bind", C.NCCL, "the server socket has failed to", 0.88,
              "torch/csrc/distributed/c10d/socket.cpp:SocketListenOp", cause="The rendezvous port could not be "
              "opened: another process (a previous instance) holds it, or the address is not this host's."),
    Signature("c10d.store_wait", C.NCCL, "clients joined", 0.85, "torch/csrc/distributed/c10d/TCPStore.cpp",
              require=True, pattern=r"waiting for clients\. \d+/\d+ clients joined",
              cause="Not every rank reached the rendezvous: some worker died or could not connect."),
    Signature("c10d.dist_network", C.NCCL, "distnetworkerror", 0.85, "torch.distributed.DistNetworkError",
              cause="torch.distributed could not connect its ranks."),
    Signature("nccl.unhandled_cuda", C.NCCL, "ncclunhandledcudaerror", 0.9, "nccl.h result codes",
              cause="NCCL hit a CUDA error (often peer-to-peer transfers the GPUs or the driver cannot do)."),
    Signature("nccl.unhandled_cuda_text", C.NCCL, "unhandled cuda error", 0.88, "NCCL 'unhandled cuda error, NCCL version'",
              cause="NCCL hit a CUDA error (often peer-to-peer transfers the GPUs or the driver cannot do)."),
    Signature("nccl.system", C.NCCL, "ncclsystemerror", 0.9, "nccl.h result codes",
              cause="NCCL hit a system error (shared memory, sockets or the driver)."),
    Signature("nccl.system_text", C.NCCL, "unhandled system error", 0.85, "NCCL 'unhandled system error'",
              cause="NCCL hit a system error (shared memory, sockets or the driver)."),
    Signature("nccl.internal", C.NCCL, "ncclinternalerror", 0.9, "nccl.h result codes", cause="NCCL internal error."),
    Signature("nccl.invalid", C.NCCL, "ncclinvalidusage", 0.85, "nccl.h result codes", cause="NCCL invalid usage."),
    Signature("nccl.remote", C.NCCL, "ncclremoteerror", 0.85, "nccl.h result codes", cause="A remote NCCL peer failed."),
    Signature("nccl.warn", C.NCCL, "nccl warn", 0.75, "NCCL debug output (NCCL_DEBUG=WARN)", cause="NCCL warned."),
    Signature("nccl.watchdog", C.NCCL, "watchdog caught collective operation timeout", 0.92,
              "torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp",
              cause="A collective operation between the GPUs hung until the NCCL watchdog timed out."),
    Signature("nccl.dist_backend", C.NCCL, "distbackenderror", 0.85, "torch.distributed.DistBackendError",
              cause="The distributed backend (NCCL) failed."),
    Signature("nccl.shm", C.NCCL, "error while creating shared memory segment", 0.92, "NCCL shm transport",
              cause="NCCL could not create its shared-memory segment: /dev/shm is too small (common in Docker)."),
    Signature("nccl.shm_dev", C.NCCL, "/dev/shm/nccl", 0.85, "NCCL shm transport",
              cause="NCCL's shared-memory segment failed: /dev/shm is too small (common in Docker)."),
    Signature("cuda.peer_access", C.NCCL, "peer access is not supported between these two devices", 0.88,
              "CUDA runtime (cudaErrorPeerAccessUnsupported)", cause="The GPUs cannot access each other's memory."),
    Signature("nccl.socket", C.NCCL, "socketstartconnect", 0.8, "NCCL socket transport",
              cause="NCCL could not connect between ranks."),
    Signature("torch.socket_listen", C.NCCL, "the server socket has failed to listen", 0.8,
              "torch/csrc/distributed/c10d/socket.cpp", cause="torch.distributed could not open its rendezvous port."),
    Signature("nccl.p2p_env", C.NCCL, "nccl_p2p_disable", 0.35, "NCCL environment", kind="hint",
              cause="NCCL peer-to-peer settings are involved."),
    Signature("generic.hang", C.NCCL, "hang", 0.5, "a hang at multi-GPU initialisation (counted only with TP/PP > 1)",
              kind="hint", require=True, pattern=r"\bhang(?:s|ing)?\b|\bhung\b",
              cause="The server hangs while the GPUs set up communication: usually NCCL peer-to-peer."),
    Signature("nccl.mention", C.NCCL, C.NCCL, 0.3, "NCCL", kind="hint", cause="NCCL is involved.", require=True,
              pattern=r"(?-i:NCCL(?![a-z])|(?<![A-Za-z])nccl(?![A-Za-z]))"),   # the name, not four letters in a word
    Signature("dist.timeout", C.NCCL, "timed out in dist_init", 0.6, "torch.distributed", kind="hint",
              cause="Distributed initialisation timed out."),
    # torch.distributed's Gloo group (vLLM's CPU group, Ray's collective setup): a host name that resolves to no
    # routable address makes Gloo bind to loopback, and the ranks on other nodes cannot connect
    # (c10d/ProcessGroupGloo.cpp createDefaultDevice; gloo/transport/tcp connectFullMesh)
    Signature("gloo.loopback", C.NCCL, "using the loopback", 0.85, "torch c10d ProcessGroupGloo.cpp", require=True,
              pattern=r"unable to resolve hostname to a \(local\) address\.\s{0,20}using the loopback",
              cause="Gloo found no routable address for this host and bound to loopback, so ranks on other nodes "
                    "cannot connect: set GLOO_SOCKET_IFNAME and NCCL_SOCKET_IFNAME to the network interface that "
                    "reaches the other nodes (e.g. ^lo,docker,veth to exclude the others)."),
    Signature("gloo.full_mesh", C.NCCL, "gloo connectfullmesh failed", 0.88, "gloo/transport/tcp (torch c10d)",
              cause="The Gloo process group could not connect all ranks: the wrong network interface (set "
                    "GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME), a firewall, or a rank that never started."),
    # Ray's own warning (ray/_private/services.py): a container with Docker's 64 MiB /dev/shm, too small for NCCL's
    # shared-memory transport between the GPUs of one host as well
    Signature("ray.small_shm", C.NCCL, "/dev/shm has only", 0.6, "ray/_private/services.py", require=True,
              pattern=r"because /dev/shm has only (?P<shm_bytes>\d{1,15}) bytes available",
              cause="The container's /dev/shm holds only {shm_bytes} bytes: NCCL's shared-memory transport between "
                    "the GPUs (tensor parallelism) needs more, and a run can hang or fail there. Start the container "
                    "with --ipc=host or --shm-size (e.g. 10g)."),
    Signature("bus.error", C.NCCL, "bus error", 0.55, "SIGBUS, typically /dev/shm exhausted", kind="hint",
              cause="A bus error, typically /dev/shm exhausted by NCCL or dataloaders."),
    # --- Hugging Face hub / transformers: access to the model ---
    Signature("hf.gated", C.MODEL_ACCESS, "gatedrepoerror", 0.97, "huggingface_hub/errors.py:GatedRepoError",
              cause="The model is gated and the request carried no token with access."),
    Signature("hf.gated_text", C.MODEL_ACCESS, "cannot access gated repo", 0.97, "huggingface_hub/utils/_http.py",
              cause="The model is gated and the request carried no token with access."),
    Signature("hf.restricted", C.MODEL_ACCESS, "is restricted. you must have access to it", 0.95,
              "huggingface_hub/utils/_http.py", cause="The model is gated and the token has no access."),
    Signature("hf.restricted_b", C.MODEL_ACCESS, "is restricted and you are not in the authorized list", 0.95,
              "huggingface_hub/utils/_http.py", cause="The token's account was not granted access to the gated model."),
    Signature("hf.auth", C.MODEL_ACCESS, "you must be authenticated to access it", 0.92, "huggingface_hub",
              cause="The model needs a Hugging Face token."),
    Signature("hf.401", C.MODEL_ACCESS, "401 client error", 0.9, "requests/huggingface_hub HTTP 401",
              cause="The Hugging Face hub refused the request (401: no or invalid token)."),
    Signature("hf.403", C.MODEL_ACCESS, "403 client error", 0.85, "requests/huggingface_hub HTTP 403",
              cause="The Hugging Face hub refused the request (403: no access)."),
    Signature("hf.404", C.MODEL_ACCESS, "404 client error", 0.9, "requests/huggingface_hub HTTP 404", require=True,
              pattern=r"404 Client Error.*(?:huggingface\.co|hf\.co)/(?P<path>\S*)",
              cause="The hub has no such file or repository ({path}): check the model id, its revision, and that "
                    "the repository holds the file."),
    # the same requests error from any other server: a route it does not serve (an old client's API, a wrong path)
    Signature("http.client_404", C.CONNECTION, "404 client error", 0.7, "requests HTTPError (not the hub)",
              require=True, pattern=r"404 Client Error: Not Found for url: https?://(?!(?:[\w-]{1,30}\.)?(?:huggingface|hf)"
                                    r"\.co\b)(?P<url>\S{1,200})",
              cause="The server answered 404 for {url}: it has no such route. The client speaks another API or "
                    "version than the server (an old client, a renamed endpoint, a base URL missing or doubling /v1)."),
    Signature("hf.invalid_token", C.MODEL_ACCESS, "invalid username or password", 0.9, "huggingface_hub",
              cause="The Hugging Face token is invalid."),
    Signature("hf.repo_not_found", C.MODEL_ACCESS, "repositorynotfounderror", 0.95, "huggingface_hub/errors.py",
              cause="The model id does not exist on the hub, or it is private/gated and no valid token was sent."),
    Signature("hf.repo_not_found_text", C.MODEL_ACCESS, "repository not found for url", 0.9, "huggingface_hub",
              cause="The model id does not exist on the hub, or it is private/gated and no valid token was sent."),
    Signature("hf.not_identifier", C.MODEL_ACCESS, "is not a valid model identifier listed on", 0.95,
              "transformers/utils/hub.py", cause="The model is neither a local folder nor a hub id this machine can "
              "reach (typo, private or gated without a token, or offline)."),
    Signature("hf.incorrect_path", C.MODEL_ACCESS, "incorrect path_or_model_id", 0.9, "transformers/utils/hub.py",
              cause="The model path or id is wrong."),
    Signature("hf.no_config", C.MODEL_ACCESS, "does not appear to have a file named config.json", 0.9,
              "transformers/utils/hub.py", cause="The model directory or repo has no config.json."),
    Signature("hf.offline", C.MODEL_ACCESS, "we couldn't connect to 'https://huggingface.co'", 0.85,
              "transformers/utils/hub.py", cause="The Hugging Face hub was unreachable and the model is not cached."),
    Signature("hf.local_entry", C.MODEL_ACCESS, "localentrynotfounderror", 0.85, "huggingface_hub/errors.py",
              cause="The model is not in the local cache and the hub was not reachable (offline mode?)."),
    Signature("hf.disk_cache", C.MODEL_ACCESS, "cannot find the requested files in the disk cache", 0.85,
              "huggingface_hub", cause="The model is not in the local cache and the hub was not reachable."),
    Signature("hf.repo_id", C.MODEL_ACCESS, "repo id must be in the form", 0.85, "huggingface_hub/utils/_validators.py",
              cause="The model id is malformed."),
    Signature("hf.revision", C.MODEL_ACCESS, "is not a valid git identifier", 0.85, "huggingface_hub",
              cause="The --revision does not exist."),
    Signature("hf.validation", C.MODEL_ACCESS, "hfvalidationerror", 0.9, "huggingface_hub/errors.py:HFValidationError",
              cause="The model argument is neither an existing local directory nor a valid hub id (check the path)."),
    Signature("hf.raise_for_status", C.MODEL_ACCESS, "hf_raise_for_status", 0.8, "huggingface_hub/utils/_http.py",
              cause="The Hugging Face hub answered an error for the model (not found, gated or unauthorised)."),
    Signature("hf.entry_not_found", C.MODEL_ACCESS, "entrynotfounderror", 0.8, "huggingface_hub/errors.py",
              cause="A file the loader needs is missing from the repo."),
    # a transport error on the way to the hub itself (requests/urllib3 name the host): the model could not be fetched,
    # whatever broke the network; an inference endpoint on another host of the domain is a client's connection
    Signature("hf.unreachable", C.MODEL_ACCESS, "huggingface.co", 0.88, "urllib3/requests HTTPSConnectionPool",
              require=True, pattern=r"host=\\?'(?:huggingface\.co|hf\.co|hf-mirror\.com|cdn-lfs[\w.-]*\.hf\.co)\\?'",
              cause="The Hugging Face hub could not be reached to fetch the model, and it is not in the local cache: "
                    "download it where there is network (huggingface-cli download) and serve the local path or run "
                    "with HF_HUB_OFFLINE=1, or fix DNS/the proxy (HF_ENDPOINT for a mirror)."),
    Signature("hf.token_hint", C.MODEL_ACCESS, "hf_token", 0.35, "huggingface_hub", kind="hint",
              cause="A Hugging Face token is involved."),
    # --- tokenizers / chat templates (transformers, tokenizers, jinja2) ---
    Signature("tf.no_template", C.TOKENIZER_CHAT_TEMPLATE, "chat_template is not set", 0.95,
              "transformers/tokenization_utils_base.py", cause="The tokenizer has no chat template."),
    Signature("jinja.error", C.TOKENIZER_CHAT_TEMPLATE, "jinja2.exceptions", 0.88, "jinja2",
              cause="The chat template failed to render."),
    Signature("jinja.template_error", C.TOKENIZER_CHAT_TEMPLATE, "templateerror", 0.7, "jinja2",
              cause="The chat template raised an error."),
    Signature("jinja.syntax", C.TOKENIZER_CHAT_TEMPLATE, "templatesyntaxerror", 0.85, "jinja2",
              cause="The chat template has a syntax error."),
    Signature("tpl.roles", C.TOKENIZER_CHAT_TEMPLATE, "conversation roles must alternate", 0.92,
              "chat templates (raise_exception)", cause="The chat template only accepts alternating user/assistant "
              "turns (and may reject a system message)."),
    Signature("tpl.system_role", C.TOKENIZER_CHAT_TEMPLATE, "system role not supported", 0.9, "chat templates",
              cause="The chat template rejects a system message."),
    Signature("tok.class", C.TOKENIZER_CHAT_TEMPLATE, "does not exist or is not currently imported", 0.9,
              "transformers/models/auto/tokenization_auto.py", cause="The tokenizer class in tokenizer_config.json "
              "is unknown to this transformers version."),
    Signature("tok.enum", C.TOKENIZER_CHAT_TEMPLATE, "data did not match any variant of untagged enum", 0.9,
              "tokenizers (Rust) deserialisation", cause="tokenizer.json was written by a newer tokenizers library "
              "than the one installed."),
    Signature("tok.cant_load", C.TOKENIZER_CHAT_TEMPLATE, "can't load tokenizer for", 0.8, "transformers",
              cause="The tokenizer could not be loaded."),
    # the JavaScript Jinja of huggingface.js (packages/jinja/src/runtime.ts: `Unknown ${type} filter: ${name}`), used by
    # LM Studio, transformers.js and others to render chat templates
    Signature("tpl.js_jinja_filter", C.TOKENIZER_CHAT_TEMPLATE, "filter:", 0.85, "huggingface.js jinja runtime.ts",
              require=True, pattern=r"unknown (?:\w*value )?filter: (?P<filter>\w+)",
              cause="The chat template uses a Jinja filter ({filter}) this template engine does not implement: "
                    "update the app, or use a template without it."),
    Signature("tok.apply", C.TOKENIZER_CHAT_TEMPLATE, "apply_chat_template", 0.5, "transformers", kind="hint",
              cause="Applying the chat template failed."),
    Signature("tok.chat_template", C.TOKENIZER_CHAT_TEMPLATE, "chat template", 0.45, "transformers", kind="hint",
              cause="The chat template is involved."),
    # --- client side: connections, timeouts, wrong URL (openai-python, httpx, requests, aiohttp, curl) ---
    Signature("http.refused", C.CONNECTION, "connection refused", 0.85, "ECONNREFUSED (all clients)",
              cause="Nothing was listening at the address: the server was down, still starting, or on another "
                    "host/port."),
    Signature("http.errno111", C.CONNECTION, "errno 111", 0.85, "ECONNREFUSED",
              cause="Nothing was listening at the address: the server was down, still starting, or elsewhere."),
    # Node's net error (lib/internal/errors.js: "connect ECONNREFUSED host:port"): web UIs and JS clients
    Signature("node.econnrefused", C.CONNECTION, "econnrefused", 0.85, "Node.js net (uvException)",
              cause="Nothing was listening at the address: the server was down, still starting, or listens on "
                    "another interface (a server bound to 127.0.0.1 is not reachable from a container's bridge "
                    "address: bind it to 0.0.0.0, e.g. OLLAMA_HOST=0.0.0.0)."),
    # Node's other net/DNS errors (lib/internal/errors.js uvException / dnsException: "<syscall> <CODE> <host>")
    Signature("node.enotfound", C.CONNECTION, "enotfound", 0.82, "Node.js dns (getaddrinfo ENOTFOUND host)",
              require=True, pattern=r"getaddrinfo (?:ENOTFOUND|EAI_AGAIN) (?P<host>[\w.-]{1,100})",
              cause="The host name {host} does not resolve where the client runs: a container name used outside its "
                    "network, a typo, or a name only the host knows (use host.docker.internal or the host's IP)."),
    Signature("node.etimedout", C.CONNECTION, "connect etimedout", 0.8, "Node.js net (uvException)",
              cause="Connecting to the server timed out: a firewall drops the packets, or the address is not the "
                    "server's (a LAN address that changed, a port not published)."),
    Signature("node.econnreset", C.CONNECTION, "econnreset", 0.7, "Node.js net (uvException)",
              cause="The server (or a proxy in between) closed the connection mid-request: it crashed or restarted, "
                    "or a proxy timed the request out."),
    # the browser's Fetch API, whatever the failure below it (Chrome's wording; Firefox says NetworkError)
    Signature("browser.failed_to_fetch", C.CONNECTION, "failed to fetch", 0.78, "WHATWG fetch (Chromium's TypeError "
              "message)", require=True, pattern=r"(?:TypeError: )?Failed to fetch\b|NetworkError when attempting to "
                                                r"fetch resource",
              cause="The browser could not reach the server: it is down, the URL is one only the server's machine "
                    "resolves (localhost from another machine), or CORS / mixed http-https content blocks it."),
    # OpenSSL's record-layer error when an HTTPS client meets a plain-HTTP server
    Signature("ssl.wrong_version", C.CONNECTION, "wrong_version_number", 0.85, "OpenSSL ssl/record (SSL routines)",
              cause="The client speaks HTTPS to a server that answers plain HTTP (vLLM and Ollama serve http:// "
                    "unless given certificates): use http:// in the base URL."),
    # the server's own refusal of a request without the key: vLLM's api-key middleware answers
    # {"error": "Unauthorized"} with 401 (entrypoints/openai/api_server.py, later server_utils.py), logged by uvicorn
    Signature("http.server_401", C.CONNECTION, "401 unauthorized", 0.8, "uvicorn access log of an OpenAI-compatible "
              "server (vLLM's --api-key / VLLM_API_KEY)", require=True,
              pattern=r'"(?:GET|POST) /v1/[^"\s]{1,200} HTTP/[\d.]{1,3}" 401 Unauthorized',
              cause="The server requires an API key (vLLM's --api-key, or VLLM_API_KEY in its environment) and the "
                    "request sent none or another: send 'Authorization: Bearer <key>', or unset the key on the "
                    "server."),
    Signature("openai.conn", C.CONNECTION, "apiconnectionerror", 0.85, "openai/_exceptions.py",
              cause="The OpenAI client could not reach the server."),
    Signature("openai.timeout", C.CONNECTION, "apitimeouterror", 0.82, "openai/_exceptions.py",
              cause="The request to the server timed out."),
    Signature("openai.conn_text", C.CONNECTION, "connection error.", 0.7, "openai/_exceptions.py",
              cause="The client could not reach the server."),
    Signature("httpx.connect", C.CONNECTION, "connecterror", 0.8, "httpx.ConnectError / aiohttp",
              cause="The client could not open a connection to the server."),
    Signature("httpx.connect_timeout", C.CONNECTION, "connecttimeout", 0.82, "httpx.ConnectTimeout",
              cause="Opening a connection to the server timed out."),
    Signature("httpx.read_timeout", C.CONNECTION, "readtimeout", 0.72, "httpx.ReadTimeout / requests",
              cause="The server accepted the connection but did not answer in time."),
    Signature("requests.max_retries", C.CONNECTION, "max retries exceeded with url", 0.82, "urllib3",
              cause="The client could not reach the server."),
    Signature("requests.new_conn", C.CONNECTION, "newconnectionerror", 0.85, "urllib3",
              cause="The client could not open a connection to the server."),
    Signature("aiohttp.connect", C.CONNECTION, "cannot connect to host", 0.85, "aiohttp",
              cause="The client could not reach the server."),
    Signature("http.remote_closed", C.CONNECTION, "remote end closed connection without response", 0.8,
              "http.client", cause="The server closed the connection without answering (it crashed or restarted)."),
    Signature("http.disconnected", C.CONNECTION, "server disconnected", 0.72, "aiohttp / httpx",
              cause="The server closed the connection (it crashed, restarted or timed out)."),
    Signature("http.dns", C.CONNECTION, "name or service not known", 0.78, "getaddrinfo",
              cause="The server's host name does not resolve."),
    # the same failures as Go's net and net/http print them (Ollama, LocalAI and other Go servers and their pulls)
    Signature("go.io_timeout", C.CONNECTION, "i/o timeout", 0.86, "Go net (net.go errTimeout: a dial or read deadline)",
              cause="The network connection timed out: a firewall or proxy, no route to the host, or a host too "
                    "slow to answer."),
    Signature("go.no_such_host", C.CONNECTION, "no such host", 0.86, "Go net (dnsclient.go errNoSuchHost)",
              cause="The host name does not resolve: DNS, or no network."),
    Signature("go.tls_timeout", C.CONNECTION, "tls handshake timeout", 0.86, "Go net/http (transport.go)",
              cause="The TLS handshake timed out: a proxy or firewall in the way, or a very slow link."),
    Signature("go.client_timeout", C.CONNECTION, "client.timeout exceeded", 0.84, "Go net/http (client.go)",
              cause="The HTTP request timed out."),
    # certificate verification, as Go's crypto/x509 (verify.go: CertificateInvalidError, UnknownAuthorityError,
    # HostnameError) and Python's ssl module (SSLCertVerificationError) word it
    Signature("tls.x509_verify", C.CONNECTION, "x509: certificate", 0.86, "Go crypto/x509 (verify.go)",
              cause="TLS verification of the server failed: its certificate is expired, self-signed or from an "
                    "authority this machine does not trust (a proxy that intercepts TLS, or a wrong system clock)."),
    Signature("tls.python_verify", C.CONNECTION, "certificate_verify_failed", 0.86,
              "Python ssl (SSLCertVerificationError)",
              cause="TLS verification of the server failed: an intercepting proxy's certificate (point "
                    "REQUESTS_CA_BUNDLE / SSL_CERT_FILE at its CA), an expired certificate, or a wrong clock."),
    Signature("net.reset", C.CONNECTION, "connection reset by peer", 0.84, "ECONNRESET (every runtime's wording)",
              cause="The other end (or a proxy) dropped the connection."),
    Signature("net.unreachable", C.CONNECTION, "network is unreachable", 0.85, "ENETUNREACH",
              cause="No route to the network: the host is offline or behind a proxy that must be configured."),
    Signature("net.no_route", C.CONNECTION, "no route to host", 0.85, "EHOSTUNREACH",
              cause="No route to the host: a firewall or the wrong address."),
    Signature("curl.connect", C.CONNECTION, "failed to connect to", 0.82, "curl (7)",
              cause="Nothing was listening at the address."),
    Signature("curl.empty", C.CONNECTION, "empty reply from server", 0.8, "curl (52)",
              cause="The server closed the connection without a reply."),
    Signature("curl.recv", C.CONNECTION, "recv failure", 0.7, "curl (56)", cause="The connection broke."),
    Signature("http.bad_gateway", C.CONNECTION, "bad gateway", 0.8, "HTTP 502 (a proxy in front of the server)",
              cause="A proxy between client and server got no answer from the server."),
    Signature("http.502", C.CONNECTION, "502", 0.55, "HTTP 502", kind="hint", require=True,
              pattern=r"(?:error|status|code|http)\W{0,3}(?P<http_status>502)\b|\b502\W{0,3}(?:error|bad gateway)",
              cause="A proxy between client and server got no answer from the server."),
    Signature("http.503", C.CONNECTION, "service unavailable", 0.6, "HTTP 503",
              cause="The server was not ready (still loading) or its engine had died."),
    Signature("http.504", C.CONNECTION, "gateway time", 0.75, "HTTP 504", cause="A proxy timed out waiting for the "
              "server."),
    Signature("http.wrong_path", C.CONNECTION, "completions http/1.1\" 404", 0.8, "uvicorn access log",
              pattern=r"\"(?:POST|GET) (?P<path>/\S*) HTTP/1\.1\" 404",
              cause="The client called {path}, which the server does not serve (the OpenAI routes are under /v1)."),
    Signature("http.no_v1", C.CONNECTION, "://", 0.75, "OpenAI-compatible routes (/v1/...)", require=True,
              pattern=r"https?:/*[\w.\-\[\]]+(?::\d+)?/(?:chat/)?completions\b",
              cause="The client calls /completions without the /v1 prefix the server's OpenAI routes use."),
    Signature("http.double_slash", C.CONNECTION, "//", 0.8, "OpenAI-compatible routes (/v1/...)", require=True,
              pattern=r"[\w\]](?::\d+)?(?:/[\w.\-]+)*//(?:chat/)?completions\b",
              cause="The base URL ends in '/' and the client appends '/chat/completions': the doubled slash is a path "
                    "the server does not route (404). Drop the trailing slash."),
    Signature("http.fastapi_no_route", C.CONNECTION, '"detail"', 0.85, "Starlette's default 404 body (FastAPI "
              "servers: vLLM's OpenAI server, trl vllm-serve)", require=True, pattern=r'\{\s*"detail"\s*:\s*"Not Found"\s*\}',
              cause="The server has no such route (FastAPI's own 404, not a model lookup): the client calls an "
                    "endpoint this server does not serve: another API's path, a missing /v1, or a server started "
                    "with another entry point than the client expects (trl vllm-serve vs vllm serve)."),
    # Ollama answers 404 on its own model routes when the model is not pulled (server/routes.go ChatHandler,
    # GenerateHandler, EmbedHandler, v0.1.48-v0.32.15); a path it does not route is Go's "404 page not found"
    Signature("http.ollama_model_route_404", C.MODEL_ACCESS, "/api/", 0.8, "Ollama's model routes", require=True,
              pattern=r"404[^\n]{0,60}?https?://[^\s'\"/]{1,100}/api/(?:chat|generate|embed|embeddings|show)\b(?!/)",
              cause="Ollama answers 404 on its own /api routes when the model the request names is not pulled: pull "
                    "it (ollama pull MODEL), or fix the name and tag the client sends."),
    # uvicorn's access line ("POST /v1/chat/completions HTTP/1.1" 400 Bad Request): the server refused the request's
    # content; vLLM's OpenAI server answers 400 for its request checks (entrypoints/openai/serving_engine.py
    # _validate_input and the chat template's errors), whose words reach only the client
    Signature("http.openai_400", C.CONTEXT_TOO_LONG, '" 400 bad request', 0.45, "uvicorn's access log (vLLM's "
              "OpenAI server)", require=True, pattern=r'"POST /v1/(?:chat/)?completions[^"]{0,40}" 400 ',
              cause="The server refused a request as invalid (HTTP 400): most often the prompt plus max_tokens exceed "
                    "max_model_len, else the chat template or a parameter was rejected. The JSON body the client got "
                    "says which."),
    Signature("http.404", C.CONNECTION, "404 not found", 0.55, "HTTP 404 (any server)",
              cause="The server answered 404: the route the client calls does not exist there (a base URL without "
                    "/v1, a doubled slash, another API's paths)."),
    Signature("http.go_404", C.CONNECTION, "404 page not found", 0.65, "Go net/http NotFound (Ollama and other Go "
              "servers)", cause="The server has no such route: check the base URL and which API the client speaks "
                                "(OpenAI's /v1/chat/completions, Ollama's /api/chat)."),
    Signature("client.cannot_connect", C.CONNECTION, "connect", 0.75, "clients' own words", require=True,
              pattern=r"(?:could ?n[o']?t|can'?t|cannot|unable to|failed to) "
                      r"(?:connect to|establish a connection (?:to|with))\s*(?P<target>\S*)",
              cause="The client could not reach the server {target}: it is not running, listens elsewhere, or a "
                    "container cannot see that host (host.docker.internal needs --add-host on Linux)."),
    Signature("client.not_reached", C.CONNECTION, "be reached", 0.75, "clients' own words (AnythingLLM, Open WebUI, "
              "IDE plugins)", require=True, pattern=r"(?:could ?n[o']?t|can ?n[o']?t|cannot) be reached",
              cause="The client could not reach the server at the address it was given: inside a container, "
                    "localhost is the container itself (use host.docker.internal, or the host's bridge address on "
                    "Linux), and a server bound to 127.0.0.1 is not reachable from elsewhere."),
    Signature("trl.not_up", C.CONNECTION, "server is not up yet", 0.7, "trl/extras/vllm_client.py",
              cause="The client polls a vLLM server that does not answer: it is still loading, failed to start, or "
                    "listens on another host or port than the client's."),
    Signature("http.via_proxy", C.CONNECTION, "proxy", 0.55, "clients behind HTTP_PROXY", require=True,
              pattern=r"(?:from|through|via|use) the (?:local |corporate |http )?proxy",
              cause="The request went through an HTTP proxy instead of straight to the server: add the server's "
                    "host to NO_PROXY (localhost, 127.0.0.1) or unset HTTP_PROXY/HTTPS_PROXY."),
    Signature("http.api_key_hint", C.CONNECTION, "api key", 0.45, "OpenAI clients", kind="hint",
              cause="The client's API key setting is involved."),
    Signature("http.addr_in_use", C.CONNECTION, "address already in use", 0.8, "EADDRINUSE",
              cause="The port is already taken by another process."),
    # Go's net.Listen error, whatever language the OS words the errno in ("listen tcp 127.0.0.1:11434: bind: ...")
    Signature("go.listen_bind", C.CONNECTION, "listen tcp", 0.85, "Go net (net.Listen's OpError)", require=True,
              pattern=r"listen tcp\d? \[?[\w.:]*\]?:(?P<port>\d+): bind:",
              cause="The server could not listen on port {port}: another process (often the same server already "
                    "running as a service) holds it; stop it, or serve on another port."),
    # openai-python's APIStatusError message: "Error code: 502 - ..."; a gateway or an unavailable server answered
    Signature("openai.status_gateway", C.CONNECTION, "error code: 50", 0.8, "openai/_exceptions.py APIStatusError",
              require=True, pattern=r"error code: (?P<http_status>50[234])\b",
              cause="The server (or a proxy in front of it) answered HTTP {http_status}: it is down, still "
                    "loading, or the proxy cannot reach it."),
    Signature("openai.api_key", C.CONNECTION, "api_key client option must be set", 0.8, "openai-python",
              cause="The OpenAI client needs an api_key even for a local server."),
    Signature("http.proxy_env", C.CONNECTION, "http_proxy", 0.4, "environment", kind="hint",
              cause="An HTTP proxy variable is set; local requests may be routed through it."),
    Signature("http.timed_out", C.CONNECTION, "timed out", 0.35, "generic", kind="hint",
              cause="Something timed out."),
    # --- capability (PyTorch / Triton / CUDA) ---
    # flash-attn's own capability check (csrc/flash_attn/flash_api.cpp TORCH_CHECK): with a message it says "... only
    # supports Ampere GPUs or newer"; without one PyTorch prints the condition ("Expected is_sm90 || is_sm8x to be
    # true, but got false")
    Signature("flash_attn.capability_check", C.DTYPE_CAPABILITY, "expected is_sm", 0.88,
              "flash-attn csrc/flash_attn/flash_api.cpp (TORCH_CHECK(is_sm90 || is_sm8x ...))", require=True,
              pattern=r"expected (?:is_sm\d+x?\s*\|\|\s*)*is_sm\d+x?\s+to be true",
              cause="The FlashAttention kernels need an Ampere (8.0) or newer GPU (some builds Turing, 7.5)."),
    Signature("flash_attn.only_supports", C.DTYPE_CAPABILITY, "only supports", 0.88, "flash-attn flash_api.cpp",
              require=True, pattern=r"only supports (?:ampere|turing|hopper) gpus or newer",
              cause="These kernels need a newer GPU generation than this one."),
    Signature("cuda.no_kernel", C.DTYPE_CAPABILITY, "no kernel image is available for execution on the device", 0.85,
              "CUDA runtime (cudaErrorNoKernelImageForDevice)",
              cause="The installed build has no kernels for this GPU's compute capability."),
    Signature("torch.sm_incompatible", C.DTYPE_CAPABILITY, "is not compatible with the current pytorch installation", 0.85,
              "torch/cuda/__init__.py", cause="This PyTorch build does not support this GPU's compute capability."),
    Signature("triton.arch", C.DTYPE_CAPABILITY, "not supported in this architecture", 0.82, "triton",
              cause="A Triton kernel uses a data type this GPU does not support."),
    Signature("bf16.fallback", C.DTYPE_CAPABILITY, "doesn't support torch.bfloat16", 0.5,
              "vllm/config/model.py _resolve_auto_dtype (a warning)", kind="hint",
              cause="The GPU has no bfloat16, so vLLM casts the model to float16; kernels that need bfloat16 (MXFP4 "
                    "MoE, some attention backends) then fail. On a mixed box, pin the newer GPU with "
                    "CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_VISIBLE_DEVICES=N."),
    Signature("bf16.generic", C.DTYPE_CAPABILITY, "bfloat16 is not supported", 0.75, "various", cause="This GPU "
              "has no bfloat16 support."),
    # --- quantized checkpoints vs loader ---
    Signature("quant.key", C.QUANTIZATION_MISMATCH, "keyerror: '", 0.3, "weight loading", kind="hint", require=True,
              pattern=r"KeyError: '(?P<key>[^']*(?:weight_scale|qweight|qzeros|scales|g_idx|input_scale|weight_packed|"
                      r"absmax|quant_map|quant_state)[^']*)'",
              # bitsandbytes keeps absmax / quant_map / quant_state beside each 4-bit weight; GPTQ/AWQ qweight,
              # qzeros, scales, g_idx; FP8 and compressed-tensors weight_scale, input_scale, weight_packed
              cause="A quantized tensor name does not match what the loader expects: the checkpoint is quantized "
                    "with a method the loader was not told of (bitsandbytes needs --quantization bitsandbytes)."),
    # --- crashes that are the engine's fault, not the configuration's ---
    Signature("cuda.illegal_access", C.ENGINE_BUG, "an illegal memory access was encountered", 0.85, "CUDA runtime",
              kind="bug", cause="A GPU kernel read or wrote out of bounds: a bug in the engine or its kernels."),
    Signature("cuda.misaligned", C.ENGINE_BUG, "misaligned address", 0.82, "CUDA runtime", kind="bug",
              cause="A GPU kernel made a misaligned access: a kernel bug."),
    Signature("cuda.illegal_instruction", C.ENGINE_BUG, "an illegal instruction was encountered", 0.82, "CUDA runtime",
              kind="bug", cause="A GPU kernel crashed."),
    Signature("cuda.device_assert", C.ENGINE_BUG, "device-side assert triggered", 0.8, "CUDA runtime", kind="bug",
              cause="A device-side assertion fired inside a GPU kernel."),
    Signature("sig.segv", C.ENGINE_BUG, "segmentation fault", 0.75, "SIGSEGV", kind="bug",
              cause="The process crashed with a segmentation fault."),
    Signature("sig.sigsegv", C.ENGINE_BUG, "sigsegv", 0.72, "SIGSEGV", kind="bug", cause="The process crashed (SIGSEGV)."),
    Signature("torch.dynamo", C.ENGINE_BUG, "torch._dynamo.exc", 0.8, "torch.compile", kind="bug",
              cause="torch.compile failed on the model: an engine/compiler bug (--enforce-eager avoids it)."),
    Signature("torch.backend_compiler", C.ENGINE_BUG, "backendcompilerfailed", 0.85, "torch.compile", kind="bug",
              cause="torch.compile failed on the model: an engine/compiler bug (--enforce-eager avoids it)."),
    Signature("torch.inductor", C.ENGINE_BUG, "inductorerror", 0.82, "torch._inductor", kind="bug",
              cause="TorchInductor failed to compile a kernel: an engine/compiler bug."),
    Signature("triton.compile", C.ENGINE_BUG, "triton.compiler.errors", 0.75, "triton", kind="bug",
              cause="A Triton kernel failed to compile."),
    Signature("cublas.exec", C.ENGINE_BUG, "cublas_status_execution_failed", 0.75, "cuBLAS", kind="bug",
              cause="A cuBLAS kernel failed."),
    Signature("bug.report", C.ENGINE_BUG, "please report this", 0.55, "generic", kind="bug",
              cause="The software itself asks for a bug report."),
    Signature("bug.open_issue", C.ENGINE_BUG, "please open an issue", 0.55, "generic", kind="bug",
              cause="The software itself asks for a bug report."),
    Signature("bug.this_is_a_bug", C.ENGINE_BUG, "this is a bug", 0.6, "generic", kind="bug",
              cause="The software itself calls this a bug."),
    # a Go engine (Ollama) and the runners it starts: a runtime panic, or a runner that aborted with no allocation
    # failure before it (an out-of-memory text outranks these)
    Signature("go.nil_pointer", C.ENGINE_BUG, "invalid memory address or nil pointer dereference", 0.78,
              "Go runtime (runtime/panic.go)", kind="bug",
              cause="The engine's Go code dereferenced a nil pointer: a crash inside the engine, not a limit of the "
                    "configuration; upgrade it, or report the crash with the model and the request."),
    Signature("go.panic", C.ENGINE_BUG, "panic: runtime error", 0.7, "Go runtime (runtime/panic.go)", kind="bug",
              cause="The engine's Go code panicked: a crash inside the engine."),
    Signature("runner.aborted", C.ENGINE_BUG, "signal: aborted", 0.65, "Go os/exec (the runner's SIGABRT)", kind="bug",
              cause="The model runner aborted (an assertion inside llama.cpp/ggml) with no allocation failure "
                    "before it: most often a model newer than the runner; upgrade the engine."),
    Signature("runner.stack_overrun", C.ENGINE_BUG, "0xc0000409", 0.65, "Windows (STATUS_STACK_BUFFER_OVERRUN)",
              kind="bug", cause="The model runner crashed (Windows' fail-fast code for an abort inside it) with no "
                                "allocation failure before it: most often a model newer than the runner; upgrade."),
    # CPython's own wordings for a call or an import the installed code does not have: packages of mismatched
    # releases (an engine and its wrapper, vLLM and transformers) or a defect; no setting of the engine causes them
    Signature("py.cannot_import", C.ENGINE_BUG, "cannot import name", 0.7,
              "CPython Python/ceval.c:import_from ('cannot import name %R from %R')",
              cause="A package imports a name the installed release of another does not have: mismatched releases "
                    "(install the versions the engine or wrapper pins)."),
    # glibc's dynamic loader (dlerror) for a compiled extension built against other libraries than those installed
    Signature("ld.undefined_symbol", C.ENGINE_BUG, "undefined symbol:", 0.78,
              "glibc elf/dl-lookup.c via dlerror ('undefined symbol: %s'), raised by CPython as ImportError",
              cause="A compiled extension (vLLM's _C, flash-attn, a CUDA kernel package) was built against other "
                    "releases of torch, CUDA or cuBLAS than those installed, or does not link a library it calls: "
                    "install the wheels built together (vLLM's pinned torch), or upgrade to the release that fixes "
                    "the link."),
    # LiteLLM's "vllm/" provider runs vLLM inside the client process (litellm/llms/vllm.py validate_environment
    # imports it); a vLLM server is reached through "hosted_vllm/" or "openai/" with api_base
    Signature("litellm.inprocess_vllm", C.CONNECTION, "vllmerror: no module named 'vllm'", 0.85,
              "litellm/llms/vllm.py:validate_environment",
              cause="LiteLLM's vllm/ provider loads vLLM inside the client instead of calling your server: use "
                    "model='hosted_vllm/<model>' (or openai/<model>) with api_base set to the server's /v1 URL."),
    # ExLlamaV2's auto-split loader (exllamav2/model.py load_autosplit_gen): weights and the cache for the context
    # length it was given do not fit together
    Signature("exl2.vram", C.KV_CACHE_TOO_SMALL, "insufficient vram for model and cache", 0.85, "exllamav2/model.py",
              cause="The weights and the KV cache for the context length asked for do not fit in VRAM together: lower "
                    "the max sequence length (the cache grows with it), or use a smaller quantization."),
    Signature("py.unexpected_kwarg", C.ENGINE_BUG, "got an unexpected keyword argument", 0.65,
              "CPython Python/ceval.c / Python/getargs.c ('%U() got an unexpected keyword argument %R')", kind="bug",
              cause="Code calls a function with an argument the installed release does not take: mismatched "
                    "releases of the engine and the code around it, or a defect."),
    Signature("py.positional_args", C.ENGINE_BUG, "positional argument", 0.65,
              "CPython Python/ceval.c ('%U() takes %d positional argument%s but %d %s given')", kind="bug",
              require=True, pattern=r"takes (?:from \d+ to )?\d+ positional arguments? but \d+ (?:was|were) given",
              cause="Code calls a function with a different number of arguments than it takes: mismatched releases "
                    "or a defect."),
    # glibc aborts the process when its heap bookkeeping is corrupt: memory corruption in native code
    Signature("glibc.heap_corruption", C.ENGINE_BUG, "double free or corruption", 0.75,
              "glibc malloc/malloc.c:malloc_printerr", kind="bug",
              cause="The C library found the heap corrupted (a double free) and aborted: a crash in native code of "
                    "the engine or a library it loads."),
    Signature("glibc.invalid_pointer", C.ENGINE_BUG, "free(): invalid pointer", 0.72,
              "glibc malloc/malloc.c:malloc_printerr", kind="bug",
              cause="The C library found the heap corrupted and aborted: a crash in native code."),
    Signature("py.assertion", C.ENGINE_BUG, "assertionerror", 0.55, "Python assert", kind="bug",
              cause="An internal assertion failed."),
    Signature("py.not_implemented", C.ENGINE_BUG, "notimplementederror", 0.5, "Python", kind="bug",
              cause="A code path is not implemented for this configuration."),
    *(Signature(f"prose.version_contrast.{i}", C.ENGINE_BUG, needle, 0.5, "a person's words", kind="hint",
                require=True, pattern=_VERSION_CONTRAST,
                cause="The same setup behaves differently on another release of the engine: a change in the "
                      "engine (a regression or a fix), not only the configuration.")
      for i, needle in enumerate(_VERSION_CONTRAST_NEEDLES)),
)
