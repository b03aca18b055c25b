"""`edgeseq serve`: a torch-free HTTP server for a bundle, with batching across requests.

    edgeseq serve bundles/g2p-en --port 8000 --max-batch 32 --max-wait-ms 5

Modules: `queue` (the bounded request queue both batchers consume, and its input limit),
`batcher` (worker threads running `Generator.generate` on merged batches),
`continuous` and `live_batch` (step batching of greedy requests: rows join the running batch
at the next decoder step), `app` (the Starlette application: /v1/generate, /v1/model,
/health, /metrics), `metrics` (Prometheus counters and histograms), `ray_app` (the same
bundle as a Ray Serve deployment).
The web stack is the `serve` extra (`pip install 'edgeseq[serve]'`); importing this package
alone needs none of it.
"""
