"""Populations: population-based training, self-play opponent matchmaking and Elo ratings. Pure and
torch-free: the runner decides, the actors draw opponents."""
