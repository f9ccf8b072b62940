"""Everything that runs inside the caller's code: label context, the manual API, SDK patches."""
