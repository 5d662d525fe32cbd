"""Recording readings as traces and replaying the policy over them."""
